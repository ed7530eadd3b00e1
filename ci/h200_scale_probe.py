"""On a GPU: does a kernel path apply ``bmm2_scale``? A direct check, independent of the oracle.

A repro's tensors are materialised once; the case is then relaunched with other ``bmm2_scale``
values, changing only ``o_scale`` (``bmm2_scale = v_scale / o_scale``; ``o_scale`` does not touch
the stored K/V, so every launch sees the same bits). A path that applies the scale returns
``s * out(1)`` (to output rounding); one that ignores it returns ``out(1)`` bit for bit.

Usage (GPU machine, repo root):
    python ci/h200_scale_probe.py REPRO [PATH ...]
        one line per (path, bmm2_scale in 1, 0.25, 0.5, 2, 4), with the float64 oracle's
        error beside it (default paths: FMHAv2, XQA, fa2, fa3)
    python ci/h200_scale_probe.py --each PATH REPRO ...
        per repro: is PATH's output at the repro's bmm2_scale bit-identical to its output at
        bmm2_scale = 1, and what is PATH's verdict on the case with bmm2_scale = 1; a tally last
Exit 0 when every launch ran, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

import difftest.paths  # noqa: F401  (registers the built-in paths)
from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import reference
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths import resolve
from difftest.paths.registry import KernelPath
from difftest.records.repro import load_repro

DEFAULT_PATHS = ("fi-context-fmha-v2", "fi-decode-xqa", "fi-prefill-fa2", "fi-prefill-fa3")
SCALES = (1.0, 0.25, 0.5, 2.0, 4.0)


def with_bmm2(case: Case, scale: float) -> Case:
    a = case.attention
    return dataclasses.replace(case, attention=dataclasses.replace(a, o_scale=a.v_scale / scale))


def relaunch(path: KernelPath, base: Batch, case: Case) -> torch.Tensor:
    out = path.run(dataclasses.replace(base, case=case)).double()
    if base.device.type == "cuda":
        torch.cuda.synchronize()
    return out


def table(file: str, names: list[str], device: torch.device) -> bool:
    case = load_repro(file).case
    base = materialize(case, device)
    a = case.attention
    print(
        f"case {case.digest()}: {a.num_qo_heads}:{a.num_kv_heads} d{a.head_dim} "
        f"{a.q_dtype}/{a.kv_dtype}->{a.out_dtype} v_scale={a.v_scale} o_scale={a.o_scale}"
    )
    ok = True
    for path in resolve(names):
        reason = path.support(case, device)
        if reason is not None:
            print(f"{path.name:<20} skipped: {reason}")
            continue
        first: torch.Tensor | None = None
        for s in SCALES:
            scaled_case = with_bmm2(case, s)
            try:
                out = relaunch(path, base, scaled_case)
            except Exception as exc:  # report and go on: one path's failure says nothing of others
                print(f"{path.name:<20} bmm2={s:<5} failed: {type(exc).__name__}: {exc}")
                ok = False
                continue
            first = out if first is None else first
            ref = reference(dataclasses.replace(base, case=scaled_case))
            error = (out - ref).abs().max().item()
            print(
                f"{path.name:<20} bmm2={s:<5} max|out-oracle|={error:<10.4g} "
                f"bitwise==out(1): {torch.equal(out, first)!s:<5} "
                f"max|out-s*out(1)|={(out - s * first).abs().max().item():.4g}"
            )
    return ok


def each(name: str, files: list[str], device: torch.device) -> bool:
    (path,) = resolve([name])
    tally: dict[tuple[bool, str], int] = {}
    ok = True
    for file in files:
        case = load_repro(file).case
        reason = path.support(case, device)
        if reason is not None:
            print(f"{file}: skipped: {reason}")
            continue
        base = materialize(case, device)
        unit = with_bmm2(case, 1.0)
        try:
            same = torch.equal(relaunch(path, base, case), relaunch(path, base, unit))
            verdict = evaluate(unit, [path], device).result_for(path.name)
        except Exception as exc:  # one case's failure is reported, the sweep goes on
            print(f"{file}: failed: {type(exc).__name__}: {exc}")
            ok = False
            continue
        outcome = verdict.outcome.value if verdict is not None else "no result"
        tally[(same, outcome)] = tally.get((same, outcome), 0) + 1
        print(
            f"{file}: bmm2={case.attention.bmm2_scale:.4g} bitwise==out(bmm2=1): {same}; "
            f"with bmm2=1: {outcome}"
        )
    for (same, outcome), n in sorted(tally.items()):
        print(f"tally: {n} repros: bitwise==out(bmm2=1) {same}, verdict with bmm2=1 {outcome}")
    return ok


def main(argv: list[str]) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if argv[:1] == ["--each"] and len(argv) >= 3:
        return 0 if each(argv[1], argv[2:], device) else 1
    if not argv or argv[0].startswith("-"):
        print(
            "usage: h200_scale_probe.py REPRO [PATH ...] | --each PATH REPRO ...", file=sys.stderr
        )
        return 2
    return 0 if table(argv[0], argv[1:] or list(DEFAULT_PATHS), device) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
