"""Run one case through its paths and the oracle, in this process: spec -> tensors -> verdict.

This is the unit of work everything else repeats: the campaign, the shrinker, replay, the
pytest plugin and the isolated worker all call :func:`evaluate`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from difftest import compare
from difftest.batch import Batch
from difftest.case import Case
from difftest.materializer import materialize
from difftest.outcome import CaseResult, Outcome, PairAgreement, PathResult
from difftest.paths.registry import KernelPath, Precision

PathStart = Callable[[str], None]

_STICKY_CUDA = ("illegal memory access", "unspecified launch failure", "device-side assert")


def is_sticky_device_error(exc: BaseException) -> bool:
    """A CUDA error that poisons the process: the result is a crash, not a refusal."""
    text = str(exc).lower()
    return any(marker in text for marker in _STICKY_CUDA)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_path(path: KernelPath, batch: Batch) -> tuple[torch.Tensor | None, PathResult]:
    """Run one path. Returns its output and a provisional result (outcome AGREE until judged),
    or ``None`` and the result that explains why there is no output."""
    start = time.perf_counter()
    try:
        out = path.run(batch)
        _sync(batch.device)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        outcome = Outcome.CRASH if is_sticky_device_error(exc) else Outcome.RAISED
        return None, PathResult(
            path=path.name,
            outcome=outcome,
            reason=f"{type(exc).__name__}: {first_line}",
            seconds=time.perf_counter() - start,
        )
    seconds = time.perf_counter() - start
    expected = (batch.case.batch.num_query_rows, *batch.q.shape[1:])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return None, PathResult(
            path=path.name,
            outcome=Outcome.RAISED,
            reason=f"returned {shape}, expected a tensor of shape {expected}",
            seconds=seconds,
        )
    return out, PathResult(path=path.name, outcome=Outcome.AGREE, seconds=seconds)


def evaluate(
    case: Case,
    paths: Sequence[KernelPath],
    device: torch.device | str = "cpu",
    *,
    tolerance: compare.Tolerance | None = None,
    check_determinism: bool = False,
    on_path_start: PathStart | None = None,
) -> CaseResult:
    """Every path's verdict on ``case``, their pairwise agreement and the time split."""
    dev = torch.device(device)
    tol = tolerance or compare.Tolerance()
    timings: dict[str, float] = {}
    results: dict[str, PathResult] = {}
    runnable = []
    for path in paths:
        reason = path.support(case, dev)
        if reason is None:
            runnable.append(path)
        else:
            results[path.name] = PathResult(
                path=path.name, outcome=Outcome.UNSUPPORTED, reason=reason
            )
    if not runnable:
        return CaseResult(case_digest=case.digest(), results=tuple(results[p.name] for p in paths))

    clock = time.perf_counter()
    batch = materialize(case, dev)
    _sync(dev)
    timings["generate"] = time.perf_counter() - clock

    clock = time.perf_counter()
    ref = compare.reference(batch)
    bounds: dict[Precision, torch.Tensor] = {}
    for path in runnable:
        precision = path.precision(case)
        if precision not in bounds:
            floor = compare.noise_floor(batch, ref, precision)
            bounds[precision] = compare.request_bounds(batch, ref, floor, tol)
    _sync(dev)
    timings["oracle"] = time.perf_counter() - clock

    outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    kernel_time = compare_time = 0.0
    for path in runnable:
        if on_path_start is not None:
            on_path_start(path.name)
        out, ran = run_path(path, batch)
        kernel_time += ran.seconds
        if out is None:
            results[path.name] = ran
            if ran.outcome is Outcome.CRASH:
                break  # the device is poisoned; the isolated runner replaces the process
            continue
        clock = time.perf_counter()
        bound = bounds[path.precision(case)]
        verdict = compare.judge(path.name, batch, out, ref, bound)
        if check_determinism and path.deterministic:
            verdict = _determinism(path, batch, out, verdict)
        results[path.name] = dataclasses.replace(verdict, seconds=ran.seconds)
        outputs[path.name] = (out, bound)
        compare_time += time.perf_counter() - clock
    timings["kernels"] = kernel_time
    timings["compare"] = compare_time
    pairs = _pairs(outputs, batch.batch_size)
    ordered = tuple(results.get(p.name) or _not_reached(p.name) for p in paths)
    return CaseResult(case_digest=case.digest(), results=ordered, pairs=pairs, timings=timings)


def _not_reached(name: str) -> PathResult:
    return PathResult(
        path=name,
        outcome=Outcome.UNSUPPORTED,
        reason="not run: an earlier path crashed the process",
    )


def _determinism(
    path: KernelPath, batch: Batch, first: torch.Tensor, verdict: PathResult
) -> PathResult:
    again, ran = run_path(path, batch)
    if again is None:
        return ran
    a, b = first.view(torch.uint8), again.view(torch.uint8)
    if torch.equal(a, b):
        return verdict
    differing = int((first != again).sum())  # NaN != NaN counts, which is what we want
    metrics = dict(verdict.metrics)
    metrics["nondeterministic_elements"] = differing
    metrics["rerun_max_abs"] = float(
        torch.nan_to_num((first.double() - again.double()).abs(), nan=float("inf")).max()
    )
    return PathResult(
        path=path.name,
        outcome=Outcome.NONDETERMINISTIC,
        reason=f"identical rerun differs in {differing} elements "
        f"(max {metrics['rerun_max_abs']:.3g})",
        metrics=metrics,
    )


def _pairs(
    outputs: dict[str, tuple[torch.Tensor, torch.Tensor]], bs: int
) -> tuple[PairAgreement, ...]:
    names = list(outputs)
    return tuple(
        compare.pair_agreement(x, y, outputs[x][0], outputs[y][0], outputs[x][1], outputs[y][1], bs)
        for i, x in enumerate(names)
        for y in names[i + 1 :]
    )
