"""On any machine: does a one-key repro's recorded error match a finite masked-logit fill?

flashinfer 0.6.16.post4 defines ``math::inf`` as ``5e4`` (``include/flashinfer/math.cuh``), and
its fa2 prefill kernel fills masked and out-of-range slots of a KV tile with ``-5e4`` in raw
logit units, multiplying by ``sm_scale * log2(e)`` only afterwards. With a tiny bmm1 scale those
slots then weigh ``2^(-(5e4 + s0) * sm_scale * log2(e))`` each instead of 0. For a repro with one
visible key (one request, no prefix, ``L = 1``, one head) the right answer is that key's value
``v0``; with ``n`` empty slots whose values are zero the kernel would return
``v0 / (1 + n * w)``. This prints the predicted max |error| and output ratio for tiles of 16, 64
and 128 slots beside what the repro recorded for each path. No GPU is needed.

Usage: python ci/fa2_mask_fill_model.py REPRO ...
"""

from __future__ import annotations

import json
import math
import sys

from difftest.generation.materialize import materialize
from difftest.model.case import Case

FILL = 5e4
TILES = (16, 64, 128)


def main(files: list[str]) -> int:
    for file in files:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
        case = Case.from_json(data["case"])
        b = case.batch
        a = case.attention
        if len(b.prefix_lens) != 1 or b.prefix_lens[0] != 0 or b.q_len != 1 or a.num_qo_heads != 1:
            print(f"{file}: not a one-key case (one request, no prefix, L=1, one head); skipped")
            continue
        batch = materialize(case)
        scale_log2 = case.attention.bmm1_scale * math.log2(math.e)
        page = int(batch.block_tables[0, 0])
        q = batch.q[0, 0].double()  # the one row, query head 0 (its KV head 0)
        k0 = batch.k_pages[page, 0, 0].double()  # the one key: slot 0 of its page
        v0 = batch.v_pages[page, 0, 0].double()
        s0 = float(q @ k0)
        w = 2.0 ** (-(FILL + s0) * scale_log2)
        print(f"{file}: bmm1_scale {case.attention.bmm1_scale:g}, masked-slot weight {w:.4f}")
        for r in data["result"]["results"]:
            if r["outcome"] == "WRONG":
                m = r["metrics"]
                ratio = m.get("scale_ratio")
                shown = f"{ratio:.5f}" if isinstance(ratio, float) else "-"
                print(f"  recorded {r['path']}: max |err| {m['max_abs']:.4f}, ratio {shown}")
        for tile in TILES:
            ratio = 1.0 / (1.0 + (tile - 1) * w)
            err = float((v0 * (1.0 - ratio)).abs().max())
            print(f"  model, {tile}-slot tile: max |err| {err:.4f}, ratio {ratio:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
