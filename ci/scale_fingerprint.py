"""On any machine: do a repro's recorded errors match a known scale misuse?

For each repro file, the float64 oracle is rerun on the repro's tensors with the scales a
kernel might have misapplied, rounded to the output dtype, and its max |error| against the
correct oracle is printed beside the error the kernel showed (``result`` of the repro):

- ``no_bmm2``: ``softmax(bmm1_scale * q.k) @ v``, bmm2_scale never applied;
- ``bmm1/bmm2``: ``softmax((bmm1_scale / bmm2_scale) * q.k) @ v``, bmm2_scale never applied
  (the XQA finding in docs/validation.md).

A kernel with that misuse shows the same error to within its own rounding. No GPU is needed.

Usage: python ci/scale_fingerprint.py REPRO ...
"""

from __future__ import annotations

import sys

import torch

from difftest.batch import Batch
from difftest.materializer import materialize
from difftest.repro import load_repro
from oracles.attention import paged_attention_reference


def oracle(batch: Batch, bmm1_scale: float, bmm2_scale: float) -> torch.Tensor:
    return paged_attention_reference(
        batch.q,
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.q_len,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        window_left=batch.window_left,
        sinks=batch.sinks,
        draft_mask=None if batch.is_chain_draft else batch.draft_mask,
        compute_dtype=torch.float64,
        p_dtype=None,
    )


def error(batch: Batch, truth: torch.Tensor, bmm1_scale: float, bmm2_scale: float) -> float:
    """Max |error| of the oracle run with these scales, in the output dtype, against ``truth``."""
    wrong = oracle(batch, bmm1_scale, bmm2_scale).to(batch.out_dtype).double()
    return (wrong - truth).abs().max().item()


def main(files: list[str]) -> int:
    if not files:
        print("usage: scale_fingerprint.py REPRO ...", file=sys.stderr)
        return 2
    for file in files:
        repro = load_repro(file)
        if repro.finding is None:
            print(f"{file}: no finding")
            continue
        recorded = repro.path_result()
        shown = float(recorded.metrics.get("max_abs", "nan")) if recorded else float("nan")
        batch = materialize(repro.case, "cpu")
        s1, s2 = batch.bmm1_scale, batch.bmm2_scale
        truth = oracle(batch, s1, s2)

        print(
            f"{file}: {repro.finding.path} bmm2_scale={s2:.4g} recorded max|err|={shown:.4g} "
            f"no_bmm2={error(batch, truth, s1, 1.0):.4g} "
            f"bmm1/bmm2={error(batch, truth, s1 / s2, 1.0):.4g}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
