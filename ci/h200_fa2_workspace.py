"""On a GPU: how much float workspace FlashInfer's fa2 prefill planner reserves, checked against
the arithmetic in docs/validation.md, and which cases overflow SGLang's workspace sizes.

Usage (GPU machine, repo root): python ci/h200_fa2_workspace.py OUT_DIR
Prints one line per check; writes a repro of the case that overflows 384 MiB to OUT_DIR.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

import difftest.paths  # noqa: F401  (registers the built-in paths)
from difftest.execution.evaluate import evaluate
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.model.outcome import Outcome
from difftest.paths import kernel_args, resolve
from difftest.records.repro import Finding, Repro, load_repro, write_repro

MIB = 1 << 20
CORPUS = Path("difftest/corpus/fa2-workspace-overflow.repro.json")


def plan_with(case: Case, workspace_bytes: int) -> str:
    """Plan (not run) FlashInfer's fa2 paged prefill for ``case``'s shape."""
    import flashinfer

    a, b = case.attention, case.batch
    kv = [p + b.q_len for p in b.all_prefix_lens()]
    dev = "cuda"
    qo = torch.arange(0, (len(kv) + 1) * b.q_len, b.q_len, dtype=torch.int32, device=dev)
    pages = [-(-t // a.page_size) for t in kv]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.arange(sum(pages), dtype=torch.int32, device=dev)
    last = torch.tensor(
        [t - (p - 1) * a.page_size for t, p in zip(kv, pages, strict=True)], dtype=torch.int32
    )
    ws = torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "HND", backend="fa2")
    try:
        w.plan(
            qo,
            indptr.to(dev),
            indices,
            last.to(dev),
            a.num_qo_heads,
            a.num_kv_heads,
            a.head_dim,
            a.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )
        return "planned"
    except RuntimeError as e:
        text = str(e)
        at = text.find("Buffer overflow")
        return text[at : at + 160] if at >= 0 else text.splitlines()[0][:160]


def main() -> int:
    out = Path(sys.argv[1])
    corpus = load_repro(CORPUS).case
    need = 267_386_880 + 2_088_960  # tmp_v + tmp_s for this shape (docs/validation.md)
    print("corpus case (16:1 GQA, D=128, 257 MiB predicted):")
    for size in (256 * MIB, need - 1, need, 384 * MIB):
        print(f"  plan with {size} bytes: {plan_with(corpus, size)}")
    wide = corpus.replace(attention=dataclasses.replace(corpus.attention, head_dim=256))
    print("same batch, D=256 (predicted 536862720 bytes, 8 KiB under 512 MiB):")
    for size in (384 * MIB, 512 * MIB, 640 * MIB):
        print(f"  plan with {size} bytes: {plan_with(wide, size)}")
    print(f"through the adapter (WORKSPACE_BYTES = {kernel_args.WORKSPACE_BYTES}):")
    paths = resolve(["fi-prefill-fa2", "torch-sdpa"])
    for name, case in (("corpus case", corpus), ("D=256", wide)):
        result = evaluate(case, paths, "cuda")
        for r in result.results:
            print(f"  {name}: {r.path} {r.outcome.value} {r.reason[:140]}")
        fa2 = result.result_for("fi-prefill-fa2")
        if fa2 is not None and fa2.outcome is Outcome.RAISED:
            repro = Repro(
                case=case,
                status="finding",
                paths=("fi-prefill-fa2", "torch-sdpa"),
                finding=Finding(path=fa2.path, kind=fa2.outcome, reason=fa2.reason),
                result=result.to_json(),
                environment=stamp("cuda"),
            )
            print("  repro:", write_repro(out, repro))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
