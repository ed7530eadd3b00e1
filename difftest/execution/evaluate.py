"""Run one case through its paths and the oracle, in this process: spec -> tensors -> verdict.

This is the unit of work everything else repeats: the campaign, the shrinker, replay, the
pytest plugin and the isolated worker all call :func:`evaluate`, or :func:`evaluate_pack` for
cases that share one launch per path (:mod:`difftest.execution.packing`); ``evaluate`` is a launch
of one. The launch's oracle output, its bounds and the verdicts that need the noise floor are
:mod:`difftest.execution.bounds`'.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, MutableMapping, Sequence

import torch

from difftest.execution import bounds, graph_replay, packing, timing
from difftest.execution.bounds import Member
from difftest.generation import placement
from difftest.generation.materialize import materialize, stores_together
from difftest.judgement import skip_softmax
from difftest.judgement import tolerance as compare
from difftest.machine.memory import out_of_memory
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths.preparation import take_prepared
from difftest.paths.registry import KernelPath

PathStart = Callable[[str], None]

_STICKY_CUDA = ("illegal memory access", "unspecified launch failure", "device-side assert")


def is_sticky_device_error(exc: BaseException) -> bool:
    """A CUDA error that poisons the process: the result is a crash, not a refusal."""
    text = str(exc).lower()
    return any(marker in text for marker in _STICKY_CUDA)


def run_path(
    path: KernelPath, batch: Batch, timings: MutableMapping[str, float] | None = None
) -> tuple[torch.Tensor | None, PathResult]:
    """Run one path. Returns its output and a provisional result (outcome AGREE until judged),
    or ``None`` and the result that explains why there is no output (an exception the path
    raised is its ``RAISED`` verdict, except running out of memory, which is raised on:
    :mod:`difftest.machine.memory`). Its time is the
    path's alone: work queued on the device before it (a packed batch's copies) is waited
    for before the clock starts, and what the path did in
    :func:`~difftest.paths.preparation.preparing` (its arguments built and checked) is
    taken out and added to ``timings["arguments"]`` (when ``timings`` is given)."""
    timing.sync(batch.device)
    take_prepared()
    start = time.perf_counter()
    try:
        with timing.phase(f"path {path.name}"):
            out = path.run(batch)
            timing.sync(batch.device)
    except Exception as exc:
        if out_of_memory(exc):
            # the launch was too large for the memory left to this process, not a verdict on
            # the kernel: the executor judges the cases alone (a worker's share of the device
            # made three paths "raise" on one case of a warm campaign, Run 37)
            raise
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        outcome = Outcome.CRASH if is_sticky_device_error(exc) else Outcome.RAISED
        return None, PathResult(
            path=path.name,
            outcome=outcome,
            reason=f"{type(exc).__name__}: {first_line}",
            detail=type(exc).__name__ if outcome is Outcome.RAISED else "",
            seconds=_kernel_seconds(start, timings),
        )
    seconds = _kernel_seconds(start, timings)
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


def _kernel_seconds(start: float, timings: MutableMapping[str, float] | None) -> float:
    """Seconds since ``start`` less the path's preparation, which goes to ``timings``."""
    prepared = take_prepared()
    if timings is not None:
        timings["arguments"] = timings.get("arguments", 0.0) + prepared
    return max(0.0, time.perf_counter() - start - prepared)


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


def _supported(
    case: Case, paths: Sequence[KernelPath], dev: torch.device, tol: compare.Tolerance
) -> Member:
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
    return Member(case, None, None, {}, runnable, results, {}, tol)


def _materialize(
    members: list[Member], dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each member's batch, its generation time in its timings. Several members (a packed
    launch) are written into one launch pool and one tensor of query rows, each into its part
    (:func:`packing.launch_pool`, :func:`packing.launch_queries`), which are returned
    (``None`` for one member); their plans reach the device in one copy
    (:func:`placement.on_device`), and on a GPU the fused stores of all of them run as a few
    launches once every case is planned (:func:`stores_together`). The device's work is waited for
    once, after every case is queued (on a GPU the host queues case k + 1 while the device
    writes case k; a wait per case kept the two apart): each case's time is what queueing it
    took, plus a share of that wait, and of the stores' launches, by the elements it writes."""
    clock = time.perf_counter()
    whole: tuple[torch.Tensor, torch.Tensor] | None = None
    pools: list[torch.Tensor | None] = [None] * len(members)
    rows: list[torch.Tensor | None] = [None] * len(members)
    plans: list[placement.DevicePlacement | None] = [None] * len(members)
    if len(members) > 1:
        cases = [m.case for m in members]
        storage, split = packing.launch_pool(cases, dev)
        queries, q_split = packing.launch_queries(cases, dev)
        whole, pools, rows = (storage, queries), list(split), list(q_split)
        plans = list(placement.on_device([placement.place(c) for c in cases], dev))
    allocated = time.perf_counter() - clock
    queued = []
    with stores_together():  # on a GPU, the launch's stores run when the block ends
        for m, pool, q, plan in zip(members, pools, rows, plans, strict=True):
            clock = time.perf_counter()
            with timing.phase("generate"):
                m.batch = materialize(m.case, dev, pool=pool, queries=q, plan=plan)
            queued.append(time.perf_counter() - clock)
            m.timings["kernels"] = m.timings["compare"] = 0.0
        clock = time.perf_counter()
    timing.sync(dev)
    waited = time.perf_counter() - clock + allocated
    written = [_elements(m.case) for m in members]
    total = max(1, sum(written))
    for m, seconds, size in zip(members, queued, written, strict=True):
        m.timings["generate"] = seconds + waited * size / total
    return whole


def _elements(case: Case) -> int:
    """The elements materialising ``case`` writes: its pool's K and V and its query rows."""
    a, b = case.attention, case.batch
    rows = b.num_query_rows + b.padding_rows
    return case.pool_elements() + rows * a.num_qo_heads * a.head_dim


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
    if live:
        whole = _materialize(live, dev)
        everyone = tuple(i for i, p in enumerate(prepared) if p.runnable)
        batches = [m.batch for m in live if m.batch is not None]
        launches[everyone] = _packed(live, batches, whole)
        floors = any(bounds.floors_first(m) for m in live)
        bounds.oracle_and_bounds(live, launches[everyone], dev, tol, floors=floors)
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
        bounds.settle(live, dev, tol)
        for m in live:
            bounds.apply_reruns(m)
    return [_case_result(p, paths) for p in prepared]


def _packed(
    members: list[Member],
    batches: list[Batch],
    whole: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> packing.PackedLaunch | None:
    """The launch of ``batches`` packed (``None``: one batch, run as it is); the time it took
    is generation, shared out by query rows. ``whole``: the launch pool and query rows the
    batches' are the parts of (:func:`_materialize`'s), else they are stacked."""
    if len(batches) < 2:
        return None
    clock = time.perf_counter()
    with timing.phase("generate (pack)"):
        launch = packing.pack(batches, *(whole or ()))
        timing.sync(batches[0].device)
    timing.share(members, "generate", time.perf_counter() - clock)
    return launch


def _run_launch(
    path: KernelPath,
    members: list[Member],
    launch: packing.PackedLaunch | None,
    check_determinism: bool,
) -> bool:
    """Run ``path`` once over ``members`` (packed as ``launch``, or the one member's batch) and
    judge each; ``True`` if it crashed the device. The cases that agree are found together,
    with one read from the device (:func:`~difftest.judgement.tolerance.agreeing`); the
    others are judged one by one."""
    batches = [m.batch for m in members if m.batch is not None]
    batch = launch.batch if launch is not None else batches[0]
    spent: dict[str, float] = {}
    out, ran = run_path(path, batch, spent)
    total_rows = sum(b.case.batch.num_query_rows for b in batches)
    shares = [ran.seconds * m.case.batch.num_query_rows / total_rows for m in members]
    for m, share in zip(members, shares, strict=True):
        m.timings["kernels"] += share
    if spent.get("arguments"):
        timing.share(members, "arguments", spent["arguments"])
    if out is None:
        note = f" (in a launch of {len(members)} packed cases)" if launch else ""
        for m, share in zip(members, shares, strict=True):
            m.results[path.name] = dataclasses.replace(ran, reason=ran.reason + note, seconds=share)
        return ran.outcome is Outcome.CRASH
    parts = launch.split(out) if launch is not None else [out]
    clock = time.perf_counter()
    keys = [bounds.bound_key(path, m.case, batch.device) for m in members]
    screened: list[PathResult | None] = [None] * len(members)
    if len(members) > 1 or batch.device.type != "cpu":
        # on a CPU a lone case is judged faster alone: no device round trips to save
        together = []
        for m, mine, key in zip(members, parts, keys, strict=True):
            assert m.batch is not None and m.ref is not None
            counts = m.case.batch.new_tokens()
            together.append(compare.Part(mine, m.ref, counts, m.bounds[key], m.within[key]))
        with timing.phase("judge"):
            screened = compare.agreeing(path.name, together)
        timing.share(members, "compare", time.perf_counter() - clock)
    for m, mine, share, key, agreed in zip(members, parts, shares, keys, screened, strict=True):
        assert m.batch is not None and m.ref is not None
        clock = time.perf_counter()
        bound = m.bounds[key]
        if agreed is not None:
            verdict = agreed
        else:
            with timing.phase("judge"):
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
        for m, repeat in zip(members, repeats, strict=True):
            m.reruns[path.name] = (repeat, rerun)  # laid over the settled verdict
    return ran.outcome is Outcome.CRASH


def _graph_verdict(
    path: KernelPath, m: Member, eager_out: torch.Tensor, eager: PathResult
) -> PathResult:
    """The verdict on a graph case: its replay's, against the oracle and the eager call."""
    assert m.batch is not None
    key = bounds.bound_key(path, m.case, m.batch.device)
    return graph_replay.judge_replay(
        path,
        m.batch,
        eager_out,
        eager,
        run_path,
        lambda batch, ref: bounds.bounds_for(batch, ref, key, m.tolerance),
        is_sticky_device_error,
    )


def _case_result(p: Member, paths: Sequence[KernelPath]) -> CaseResult:
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
