"""GPU smoke run of the FlashInfer paths: a few handpicked cases per path, each judged by
``difftest.execution.evaluate.evaluate`` and cross-checked against an independent per-request
float64 loop
(written here, sharing no code with the oracle), so a disagreement can be pinned on the kernel.

Usage (on a GPU machine with FlashInfer installed)::

    python ci/gpu_smoke.py [--out DIR] [--paths fi-decode-xqa,fi-prefill-fa2] [--skip-expensive]

Writes ``DIR/smoke.jsonl`` (one line per case and path; DIR defaults to ``$DIFFTEST_GPU_OUT``,
else ``difftest-out/gpu``) and prints a summary table. On the project's device machine:
``bash ci/device_runner.sh ci/gpu_smoke.py --skip-expensive``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import reference
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)
from difftest.paths import get_path

EXPENSIVE = {"fi-prefill-fa3", "fi-context-fmha-v2"}
TREE = TreeDraft(parents=(-1, 0, 0, 1))


def case(
    *,
    hq: int = 16,
    hkv: int = 2,
    d: int = 128,
    ps: int = 64,
    L: int = 4,
    prefixes: tuple[int, ...] = (37, 300),
    kv: str = "bf16",
    window: int = -1,
    sinks: bool = False,
    tree: bool = False,
    storage: str = "kv_split_nhd",
    convention: str = "sglang",
    seed: int = 1,
    mode: str = "target_verify",
) -> Case:
    """A case with the knobs the smoke run turns."""
    return Case(
        attention=AttentionConfig(
            num_qo_heads=hq,
            num_kv_heads=hkv,
            head_dim=d,
            page_size=ps,
            kv_dtype=kv,  # type: ignore[arg-type]
            window_left=window,
            sinks=sinks,
            k_scale=0.5 if kv == "fp8_e4m3" else 1.0,
            v_scale=0.5 if kv == "fp8_e4m3" else 1.0,
        ),
        batch=BatchSpec(
            mode=mode,  # type: ignore[arg-type]
            prefix_lens=prefixes,
            q_len=L,
            draft=TREE if tree else CausalDraft(),
        ),
        pool=PoolSpec(
            kv_storage=storage,  # type: ignore[arg-type]
            page_order="shuffled",
            table_width="context",
            table_fill="stale_pages",
            stale_fill="randn",
            spare_pages=3,
            context_len=4096 if max(prefixes) < 4000 else 16384,
        ),
        values=ValueSpec(),
        convention=convention,  # type: ignore[arg-type]
        seed=seed,
    )


SMOKE: dict[str, list[Case]] = {
    "fi-decode-xqa": [
        case(),
        case(hkv=2, sinks=True, tree=True, mode="draft_extend_v2", storage="hnd"),
        case(kv="fp8_e4m3", convention="plain"),
    ],
    "fi-decode-wrapper": [case(), case(storage="nhd", mode="draft_extend_v2")],
    "fi-prefill-fa2": [case(), case(tree=True, storage="hnd"), case(sinks=True)],
    "fi-prefill-fa3": [case(), case(sinks=True)],
    "fi-context-fmha-v2": [case(storage="hnd"), case(storage="hnd", sinks=True, window=127)],
}


def independent(case: Case, device: torch.device) -> torch.Tensor:
    """Per-request float64 loop over tokens: gathers K/V slot by slot, masks by position."""
    b = materialize(case, device)
    a, L = case.attention, case.batch.q_len
    ps, group = a.page_size, a.group_size
    outs = []
    table = b.block_tables.cpu().tolist()
    for r, t in enumerate(b.seq_lens.cpu().tolist()):
        pages = [table[r][j // ps] for j in range(t)]
        slots = [j % ps for j in range(t)]
        k = torch.stack([b.k_pages[p, :, s] for p, s in zip(pages, slots, strict=True)]).double()
        v = torch.stack([b.v_pages[p, :, s] for p, s in zip(pages, slots, strict=True)]).double()
        q = b.q[r * L : (r + 1) * L].double()  # [L, Hq, D]
        k = k.repeat_interleave(group, dim=1)  # [T, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("lhd,thd->lht", q, k) * b.bmm1_scale
        for i in range(L):
            pos = t - L + i
            for j in range(t):
                seen = j <= pos
                if a.window_left >= 0:
                    seen = seen and j >= pos - a.window_left
                if j >= t - L:
                    seen = seen and bool(b.draft_mask[i, j - (t - L)])
                if not seen:
                    s[i, :, j] = float("-inf")
        m = s.amax(-1)
        if b.sinks is not None:
            m = torch.maximum(m, b.sinks.double())
        e = torch.exp(s - m[..., None])
        den = e.sum(-1) + (torch.exp(b.sinks.double() - m) if b.sinks is not None else 0.0)
        outs.append(torch.einsum("lht,thd->lhd", e / den[..., None], v) * b.bmm2_scale)
    return torch.cat(outs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("DIFFTEST_GPU_OUT", "difftest-out/gpu"))
    parser.add_argument("--paths", default="")
    parser.add_argument("--skip-expensive", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    import flashinfer

    print(f"gpu: {torch.cuda.get_device_name(0)} cc={torch.cuda.get_device_capability(0)}")
    print(f"torch {torch.__version__} flashinfer {flashinfer.__version__}")
    names = [n for n in args.paths.split(",") if n] or list(SMOKE)
    if args.skip_expensive:
        names = [n for n in names if n not in EXPENSIVE]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out_file = Path(args.out) / "smoke.jsonl"
    bad = 0
    with out_file.open("w") as fh:
        for name in names:
            path = get_path(name)
            for i, c in enumerate(SMOKE[name]):
                start = time.perf_counter()
                result = evaluate(c, [path], device, check_determinism=True).results[0]
                wall = time.perf_counter() - start
                loop_err = float(
                    (independent(c, device) - reference(materialize(c, device))).abs().max()
                )
                row = {
                    "path": name,
                    "case": i,
                    "digest": c.digest(),
                    "outcome": result.outcome.value,
                    "reason": result.reason,
                    "metrics": result.metrics,
                    "oracle_vs_loop": loop_err,
                    "seconds": round(wall, 2),
                    "case_json": c.to_json(),
                }
                fh.write(json.dumps(row, default=str) + "\n")
                fh.flush()
                bad += result.outcome.value not in ("AGREE", "UNSUPPORTED")
                print(
                    f"{name:22s} case{i} {result.outcome.value:12s} {wall:6.1f}s "
                    f"oracle~loop={loop_err:.1e} {result.reason[:150]}",
                    flush=True,
                )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
