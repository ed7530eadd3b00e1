"""Run one case through its paths and the oracle, in this process: spec -> tensors -> verdict.

This is the unit of work everything else repeats: the campaign, the shrinker, replay, the
pytest plugin and the isolated worker all call :func:`evaluate`, or :func:`evaluate_pack` for
cases that share one launch per path (:mod:`difftest.execution.packing`); ``evaluate`` is a launch
of one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from difftest.execution import graph_replay, packing
from difftest.generation.materialize import materialize
from difftest.judgement import skip_softmax
from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Outcome, PairAgreement, PathResult
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


def _phase(name: str) -> torch.profiler.record_function:
    """A range named ``difftest.<name>`` for :mod:`torch.profiler` (what
    ``benchmarks/profile_gpu_time.py`` sums device time by; next to nothing when no profiler
    runs)."""
    return torch.profiler.record_function(f"difftest.{name}")


def run_path(path: KernelPath, batch: Batch) -> tuple[torch.Tensor | None, PathResult]:
    """Run one path. Returns its output and a provisional result (outcome AGREE until judged),
    or ``None`` and the result that explains why there is no output."""
    start = time.perf_counter()
    try:
        with _phase(f"path {path.name}"):
            out = path.run(batch)
            _sync(batch.device)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        outcome = Outcome.CRASH if is_sticky_device_error(exc) else Outcome.RAISED
        return None, PathResult(
            path=path.name,
            outcome=outcome,
            reason=f"{type(exc).__name__}: {first_line}",
            detail=type(exc).__name__ if outcome is Outcome.RAISED else "",
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
            detail="bad-shape",
            seconds=seconds,
        )
    backend = (path.backend() if path.backend is not None else None) or ""
    return out, PathResult(path=path.name, outcome=Outcome.AGREE, seconds=seconds, backend=backend)


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
    return evaluate_pack(
        [case],
        paths,
        device,
        tolerance=tolerance,
        check_determinism=check_determinism,
        on_path_start=on_path_start,
    )[0]


BoundKey = tuple[Precision, bool]
"""A path's precision, and whether it applies the case's skip-softmax factor."""


def bound_key(path: KernelPath, case: Case, device: torch.device) -> BoundKey:
    honours = (
        case.attention.skip_softmax_threshold_scale_factor is not None
        and path.modes.skip(case, device) == "honours"
    )
    return path.precision(case), honours


def bounds_for(
    batch: Batch, ref: torch.Tensor, key: BoundKey, tol: compare.Tolerance
) -> torch.Tensor:
    """``[bs]`` the bound each request of ``batch`` is held to by a path of ``key``: the noise
    floor's, plus the skip allowance for a path that applies the skip-softmax factor."""
    precision, honours = key
    floor = compare.noise_floor(batch, ref, precision)
    bound = compare.request_bounds(batch, ref, floor, tol)
    return bound + skip_softmax.allowance(batch) if honours else bound


@dataclasses.dataclass(slots=True)
class _Prepared:
    """One case's batch, oracle output and bounds (per :data:`BoundKey`), and its results so
    far."""

    case: Case
    batch: Batch | None
    ref: torch.Tensor | None
    bounds: dict[BoundKey, torch.Tensor]
    runnable: list[KernelPath]
    results: dict[str, PathResult]
    timings: dict[str, float]
    tolerance: compare.Tolerance
    outputs: dict[str, tuple[torch.Tensor, BoundKey]] = dataclasses.field(default_factory=dict)
    """Each judged path's output, and the key of the bound it is held to."""
    exact: dict[Precision, torch.Tensor] = dataclasses.field(default_factory=dict)
    """The exact-attention bounds (without the skip allowance), per precision."""
    within: dict[BoundKey, torch.Tensor] = dataclasses.field(default_factory=dict)
    """The part of each bound that holds whatever the noise floor: the absolute allowance
    (plus the skip allowance for a path that applies the factor)."""
    floors: bool = False
    """Whether the bounds include the noise floors (else each is its absolute allowance
    alone, until :func:`_settle` finds a verdict that needs more)."""
    pairs: tuple[PairAgreement, ...] = ()


def _supported(
    case: Case, paths: Sequence[KernelPath], dev: torch.device, tol: compare.Tolerance
) -> _Prepared:
    """``case`` with the paths that support it, and an ``UNSUPPORTED`` verdict from each other."""
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
    return _Prepared(case, None, None, {}, runnable, results, {}, tol)


def _materialize(members: list[_Prepared], dev: torch.device) -> None:
    for m in members:
        clock = time.perf_counter()
        with _phase("generate"):
            m.batch = materialize(m.case, dev)
            _sync(dev)
        m.timings["generate"] = time.perf_counter() - clock
        m.timings["kernels"] = m.timings["compare"] = 0.0


def _oracle_and_bounds(
    members: list[_Prepared],
    launch: packing.PackedLaunch | None,
    dev: torch.device,
    tol: compare.Tolerance,
    *,
    floors: bool = True,
) -> torch.Tensor:
    """Every member's oracle output and bounds from one batched oracle pass over the launch
    (``launch``: the members packed; ``None``: the one member alone). Each case's rows and
    requests are cut out of it, so what a case gets is what it gets alone (up to float64
    rounding, see :mod:`difftest.oracle.batched`). Oracle time is shared out by query rows.
    ``floors``: measure the noise floors now; else the bounds are the absolute allowances
    alone until :func:`_settle` needs more. Returns the launch's float64 output."""
    clock = time.perf_counter()
    whole = _whole(members, launch)
    with _phase("oracle"):
        ref, lows = compare.oracle_outputs(whole, _precisions(members) if floors else ())
    with _phase("bounds"):
        _bounds(members, launch, ref, lows if floors else None, dev, tol)
        _sync(dev)
    _share_oracle_time(members, time.perf_counter() - clock)
    return ref


def _whole(members: list[_Prepared], launch: packing.PackedLaunch | None) -> Batch:
    """The batch the paths run: the launch's, or the one member's."""
    if launch is not None:
        return launch.batch
    assert members[0].batch is not None
    return members[0].batch


def _precisions(members: list[_Prepared]) -> set[Precision]:
    return {p.precision(m.case) for m in members for p in m.runnable}


def _share_oracle_time(members: list[_Prepared], seconds: float) -> None:
    rows = [m.case.batch.num_query_rows for m in members]
    for m, n in zip(members, rows, strict=True):
        m.timings["oracle"] = m.timings.get("oracle", 0.0) + seconds * n / max(1, sum(rows))


def _bounds(
    members: list[_Prepared],
    launch: packing.PackedLaunch | None,
    ref: torch.Tensor,
    lows: dict[Precision, torch.Tensor] | None,
    dev: torch.device,
    tol: compare.Tolerance,
) -> None:
    """Each member's rows of the launch's oracle output ``ref`` and its bounds, per
    :data:`BoundKey` (``lows``: the oracle at each precision, for the noise floors; ``None``:
    not measured, and each bound is the absolute allowance alone, which every bound holds)."""
    for i, m in enumerate(members):
        assert m.batch is not None
        rows = launch.rows_of(i) if launch is not None else slice(None)
        m.ref = ref[rows]
        absolute = compare.absolute_allowance(m.batch, m.ref, tol)
        m.bounds.clear()
        m.exact.clear()
        m.within.clear()
        m.floors = lows is not None
        allowance = None
        for path in m.runnable:
            key = bound_key(path, m.case, dev)
            if key in m.bounds:
                continue
            precision = key[0]
            if precision not in m.exact:
                if lows is None:
                    m.exact[precision] = absolute
                else:
                    floor = compare.floor_of(lows[precision][rows], m.ref, m.batch)
                    bound = compare.request_bounds(m.batch, m.ref, floor, tol, absolute)
                    m.exact[precision] = bound
            bound, within = m.exact[precision], absolute
            if key[1]:  # the path applies the case's skip-softmax factor
                allowance = skip_softmax.allowance(m.batch) if allowance is None else allowance
                bound, within = bound + allowance, within + allowance
            m.bounds[key], m.within[key] = bound, within


def _floors_first(m: _Prepared, check_determinism: bool) -> bool:
    """Whether ``m``'s verdicts need the noise floors before any path is judged: those made
    from a judgement by another step (a determinism rerun, the skip-softmax rules, a graph
    replay) keep what the judgement said, so it must be the final one."""
    return (
        check_determinism
        or m.case.graph is not None
        or m.case.attention.skip_softmax_threshold_scale_factor is not None
    )


def _settle(
    members: list[_Prepared],
    launch: packing.PackedLaunch | None,
    ref: torch.Tensor,
    dev: torch.device,
    tol: compare.Tolerance,
) -> None:
    """Each member's pairs, and its final verdicts.

    A launch judged against the absolute allowances alone (the noise floors not measured)
    keeps every AGREE: each bound holds its allowance, so an error within the allowance is
    within the bound. Only a path over its allowance, or a pair of paths over their two,
    needs the floors: they are then measured for the whole launch (the same bounds as when
    measured first) and every verdict and pair that was not an agreement is judged again.
    Most launches agree within the allowance, which saves the oracle's float32 passes.
    """
    for m in members:
        _pair_up(m)
    unsettled = [
        m
        for m in members
        if not m.floors
        and (
            any(m.results[name].outcome is not Outcome.AGREE for name in m.outputs)
            or not all(p.agree for p in m.pairs)
        )
    ]
    if not unsettled:
        return
    clock = time.perf_counter()
    with _phase("oracle"):
        lows = compare.low_outputs(_whole(members, launch), _precisions(members))
    with _phase("bounds"):
        _bounds(members, launch, ref, lows, dev, tol)
    _share_oracle_time(members, time.perf_counter() - clock)
    for m in members:
        clock = time.perf_counter()
        assert m.batch is not None and m.ref is not None
        for name, (out, key) in m.outputs.items():
            first = m.results[name]
            if first.outcome is Outcome.AGREE:
                continue
            with _phase("judge"):
                again = compare.judge(name, m.batch, out, m.ref, m.bounds[key], m.within[key])
            m.results[name] = dataclasses.replace(
                again, seconds=first.seconds, backend=first.backend
            )
        m.timings["compare"] += time.perf_counter() - clock
        _pair_up(m)


def evaluate_pack(
    cases: Sequence[Case],
    paths: Sequence[KernelPath],
    device: torch.device | str = "cpu",
    *,
    tolerance: compare.Tolerance | None = None,
    check_determinism: bool = False,
    on_path_start: PathStart | None = None,
) -> list[CaseResult]:
    """Each case's :class:`CaseResult`, running every path once over all the cases it supports
    (one packed launch, see :mod:`difftest.execution.packing`; ``cases`` must be packable).

    Each case is materialised and judged on its own rows of the launch's output, against its
    own rows of one batched oracle pass over the launch. A launch that raises gives that
    verdict to every case in it; the caller confirms any non-AGREE verdict by rerunning the
    case alone (:func:`difftest.execution.launches.judge_launch`). Kernel and oracle time are
    shared out by query rows. Paths that support the same cases share one packed batch (built
    once).

    It all runs in :func:`torch.inference_mode`: nothing here is differentiated, and each
    tensor operation then skips autograd's bookkeeping (version counters, view tracking),
    which on small CPU cases is a tenth of their time. A tensor made here is an inference
    tensor, read anywhere but changed in place only in inference mode: a buffer a path keeps
    across cases must be made outside it (:func:`difftest.paths.kernel_args.zeroed_workspace`).
    """
    with torch.inference_mode():
        return _evaluate_pack(cases, paths, device, tolerance, check_determinism, on_path_start)


def _evaluate_pack(
    cases: Sequence[Case],
    paths: Sequence[KernelPath],
    device: torch.device | str,
    tolerance: compare.Tolerance | None,
    check_determinism: bool,
    on_path_start: PathStart | None,
) -> list[CaseResult]:
    dev = torch.device(device)
    tol = tolerance or compare.Tolerance()
    prepared = [_supported(case, paths, dev, tol) for case in cases]
    live = [p for p in prepared if p.runnable]
    launches: dict[tuple[int, ...], packing.PackedLaunch | None] = {}
    ref: torch.Tensor | None = None
    if live:
        _materialize(live, dev)
        everyone = tuple(i for i, p in enumerate(prepared) if p.runnable)
        batches = [m.batch for m in live if m.batch is not None]
        launches[everyone] = _packed(live, batches)
        floors = any(_floors_first(m, check_determinism) for m in live)
        ref = _oracle_and_bounds(live, launches[everyone], dev, tol, floors=floors)
    for path in paths:
        key = tuple(i for i, p in enumerate(prepared) if path in p.runnable)
        if not key:
            continue
        if on_path_start is not None:
            on_path_start(path.name)
        members = [prepared[i] for i in key]
        if key not in launches:
            batches = [m.batch for m in members if m.batch is not None]
            launches[key] = _packed(members, batches)
        crashed = _run_launch(path, members, launches[key], check_determinism)
        if crashed:
            break  # the device is poisoned; the isolated runner replaces the process
    if live:
        assert ref is not None
        _settle(live, launches[everyone], ref, dev, tol)
    return [_case_result(p, paths) for p in prepared]


def _packed(members: list[_Prepared], batches: list[Batch]) -> packing.PackedLaunch | None:
    """The launch of ``batches`` packed (``None``: one batch, run as it is); the time it took
    is generation, shared out by query rows."""
    if len(batches) < 2:
        return None
    clock = time.perf_counter()
    with _phase("generate (pack)"):
        launch = packing.pack(batches)
    seconds = time.perf_counter() - clock
    rows = sum(b.case.batch.num_query_rows for b in batches)
    for m, b in zip(members, batches, strict=True):
        m.timings["generate"] += seconds * b.case.batch.num_query_rows / max(1, rows)
    return launch


def _run_launch(
    path: KernelPath,
    members: list[_Prepared],
    launch: packing.PackedLaunch | None,
    check_determinism: bool,
) -> bool:
    """Run ``path`` once over ``members`` (packed as ``launch``, or the one member's batch) and
    judge each; ``True`` if it crashed the device."""
    batches = [m.batch for m in members if m.batch is not None]
    batch = launch.batch if launch is not None else batches[0]
    out, ran = run_path(path, batch)
    total_rows = sum(b.case.batch.num_query_rows for b in batches)
    shares = [ran.seconds * m.case.batch.num_query_rows / total_rows for m in members]
    for m, share in zip(members, shares, strict=True):
        m.timings["kernels"] += share
    if out is None:
        note = f" (in a launch of {len(members)} packed cases)" if launch else ""
        for m, share in zip(members, shares, strict=True):
            m.results[path.name] = dataclasses.replace(ran, reason=ran.reason + note, seconds=share)
        return ran.outcome is Outcome.CRASH
    parts = launch.split(out) if launch is not None else [out]
    for m, mine, share in zip(members, parts, shares, strict=True):
        assert m.batch is not None and m.ref is not None
        clock = time.perf_counter()
        key = bound_key(path, m.case, m.batch.device)
        bound = m.bounds[key]
        with _phase("judge"):
            verdict = compare.judge(path.name, m.batch, mine, m.ref, bound, m.within[key])
        verdict = dataclasses.replace(verdict, seconds=share, backend=ran.backend)
        if skip_softmax.factor_of(m.batch) is not None:
            if key[1]:
                exact = m.exact[key[0]]
                verdict = skip_softmax.honoured(verdict, m.batch, mine, m.ref, exact, bound - exact)
            else:
                verdict = skip_softmax.ignored(verdict, m.batch)
        m.results[path.name] = verdict
        m.outputs[path.name] = (mine, key)
        m.timings["compare"] += time.perf_counter() - clock
        if m.case.graph is not None:
            clock = time.perf_counter()
            m.results[path.name] = _graph_verdict(path, m, mine, verdict)
            m.timings["graph"] = m.timings.get("graph", 0.0) + time.perf_counter() - clock
            if m.results[path.name].outcome is Outcome.CRASH:
                return True  # the replay poisoned the device
    if check_determinism and path.deterministic:
        again, rerun = run_path(path, batch)
        repeats: list[torch.Tensor | None] = [None] * len(parts)
        if again is not None:
            repeats = list(launch.split(again)) if launch is not None else [again]
        for m, mine, repeat in zip(members, parts, repeats, strict=True):
            m.results[path.name] = _determinism(m.results[path.name], mine, repeat, rerun)
    return ran.outcome is Outcome.CRASH


def _graph_verdict(
    path: KernelPath, m: _Prepared, eager_out: torch.Tensor, eager: PathResult
) -> PathResult:
    """The verdict on a graph case: its replay's, against the oracle and the eager call."""
    assert m.batch is not None
    key = bound_key(path, m.case, m.batch.device)
    return graph_replay.judge_replay(
        path,
        m.batch,
        eager_out,
        eager,
        run_path,
        lambda batch, ref: bounds_for(batch, ref, key, m.tolerance),
        is_sticky_device_error,
    )


def _case_result(p: _Prepared, paths: Sequence[KernelPath]) -> CaseResult:
    digest = p.case.digest()
    if p.batch is None:
        return CaseResult(case_digest=digest, results=tuple(p.results[x.name] for x in paths))
    ordered = tuple(p.results.get(x.name) or _not_reached(x.name) for x in paths)
    return CaseResult(case_digest=digest, results=ordered, pairs=p.pairs, timings=p.timings)


def _not_reached(name: str) -> PathResult:
    return PathResult(
        path=name,
        outcome=Outcome.UNSUPPORTED,
        reason="not run: an earlier path crashed the process",
    )


def _determinism(
    verdict: PathResult, first: torch.Tensor, again: torch.Tensor | None, rerun: PathResult
) -> PathResult:
    """``verdict``, or NONDETERMINISTIC when an identical rerun gave other bits."""
    if again is None:
        return rerun
    a, b = first.view(torch.uint8), again.view(torch.uint8)
    if torch.equal(a, b):
        return verdict
    differing = int((first != again).sum())  # NaN != NaN counts, which is what we want
    rerun_max = float(
        torch.nan_to_num((first.double() - again.double()).abs(), nan=float("inf")).max()
    )
    metrics = dataclasses.replace(
        verdict.metrics, nondeterministic_elements=differing, rerun_max_abs=rerun_max
    )
    return PathResult(
        path=verdict.path,
        outcome=Outcome.NONDETERMINISTIC,
        reason=f"identical rerun differs in {differing} elements (max {rerun_max:.3g})",
        metrics=metrics,
        seconds=verdict.seconds,
        backend=verdict.backend,
    )


def _pair_up(m: _Prepared) -> None:
    """``m.pairs``: every two judged paths' agreement, under the bounds ``m`` has now."""
    assert m.batch is not None
    clock = time.perf_counter()
    names = list(m.outputs)
    rows = m.batch.row_requests() if m.batch.is_ragged else None
    with _phase("pairs"):
        m.pairs = tuple(
            compare.pair_agreement(
                x,
                y,
                m.outputs[x][0],
                m.outputs[y][0],
                m.bounds[m.outputs[x][1]],
                m.bounds[m.outputs[y][1]],
                m.batch.batch_size,
                rows,
            )
            for i, x in enumerate(names)
            for y in names[i + 1 :]
        )
    m.timings["compare"] = m.timings.get("compare", 0.0) + time.perf_counter() - clock
