"""A launch's oracle output and bounds, and the verdicts that need the noise floor.

Each case of a launch (a :class:`Member`) is held, per path, to a bound of its precision
(:data:`BoundKey`): ``rtol`` times the noise floor plus an absolute allowance
(:mod:`difftest.judgement.tolerance`). Every bound holds its allowance, so a path whose error
is within it agrees whatever the floor: the floor's low-precision oracle passes run only for a
case of a launch that has a path or pair over its allowance, on that case's own batch
(:func:`settle`), and then each of its verdicts that was not an agreement is judged again
against the whole bound. Verdicts are the same either way; most launches never measure the
floor.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from difftest.execution import packing, timing
from difftest.judgement import skip_softmax
from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import Outcome, PairAgreement, PathResult
from difftest.oracle import fused
from difftest.paths.registry import KernelPath, Precision

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
    floor = compare.noise_floor(batch, ref, precision, fused.batched_attention)
    bound = compare.request_bounds(batch, ref, floor, tol)
    return bound + skip_softmax.allowance(batch) if honours else bound


@dataclasses.dataclass(slots=True)
class Member:
    """One case of a launch: its batch, oracle output and bounds (per :data:`BoundKey`), and
    its results so far."""

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
    alone, until :func:`settle` finds a verdict that needs more)."""
    pairs: tuple[PairAgreement, ...] = ()
    reruns: dict[str, tuple[torch.Tensor | None, PathResult]] = dataclasses.field(
        default_factory=dict
    )
    """Each path's determinism rerun: its output (``None``: it gave none) and its result,
    laid over the path's final verdict once the launch is settled (:func:`apply_reruns`)."""


def oracle_and_bounds(
    members: list[Member],
    launch: packing.PackedLaunch | None,
    dev: torch.device,
    tol: compare.Tolerance,
    *,
    floors: bool = True,
) -> None:
    """Every member's oracle output and bounds from one batched oracle pass over the launch
    (``launch``: the members packed; ``None``: the one member alone). Each case's rows and
    requests are cut out of it, so what a case gets is what it gets alone (up to float64
    rounding, see :mod:`difftest.oracle.batched`). Oracle time is shared out by query rows.
    ``floors``: measure the noise floors now; else the bounds are the absolute allowances
    alone until :func:`settle` needs more."""
    clock = time.perf_counter()
    whole = _whole(members, launch)
    with timing.phase("oracle"):
        wanted = _precisions(members) if floors else ()
        ref, lows = compare.oracle_outputs(whole, wanted, fused.batched_attention)
    with timing.phase("bounds"):
        _bounds(members, launch, ref, lows if floors else None, dev, tol)
        timing.sync(dev)
    timing.share(members, "oracle", time.perf_counter() - clock)


def _whole(members: list[Member], launch: packing.PackedLaunch | None) -> Batch:
    """The batch the paths run: the launch's, or the one member's."""
    if launch is not None:
        return launch.batch
    assert members[0].batch is not None
    return members[0].batch


def _precisions(members: list[Member]) -> set[Precision]:
    return {p.precision(m.case) for m in members for p in m.runnable}


def _bounds(
    members: list[Member],
    launch: packing.PackedLaunch | None,
    ref: torch.Tensor,
    lows: dict[Precision, torch.Tensor] | None,
    dev: torch.device,
    tol: compare.Tolerance,
) -> None:
    """Each member's rows of the launch's oracle output ``ref`` and its bounds, per
    :data:`BoundKey` (``lows``: the oracle at each precision, for the noise floors; ``None``:
    not measured, and each bound is the absolute allowance alone, which every bound holds)."""
    whole = _whole(members, launch)
    absolute_all = compare.absolute_allowance(whole, ref, tol)  # per request: exact maxima
    exact_all: dict[Precision, torch.Tensor] = {}
    if lows is not None:
        for precision in _precisions(members):
            floor = compare.floor_of(lows[precision], ref, whole)
            exact_all[precision] = compare.request_bounds(whole, ref, floor, tol, absolute_all)
    first = 0
    for i, m in enumerate(members):
        assert m.batch is not None
        rows = launch.rows_of(i) if launch is not None else slice(None)
        mine = slice(first, first + m.batch.batch_size)  # this case's requests in the launch
        first = mine.stop
        m.ref = ref[rows]
        absolute = absolute_all[mine]
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
                m.exact[precision] = absolute if lows is None else exact_all[precision][mine]
            bound, within = m.exact[precision], absolute
            if key[1]:  # the path applies the case's skip-softmax factor
                allowance = skip_softmax.allowance(m.batch) if allowance is None else allowance
                bound, within = bound + allowance, within + allowance
            m.bounds[key], m.within[key] = bound, within


def floors_first(m: Member) -> bool:
    """Whether ``m``'s verdicts need the noise floors before any path is judged: those made
    from a judgement by another step (the skip-softmax rules, a graph replay) keep what the
    judgement said, so it must be the final one. A determinism rerun does not: its outcome
    is laid over the final verdict after :func:`settle` (:func:`apply_reruns`), so a launch
    that checks determinism measures the floors only when a verdict needs them, as any
    other (it measured them first until Run 32: the float32 passes over the whole launch
    for every launch that held a checked case, half of a GPU campaign's launches)."""
    return (
        m.case.graph is not None or m.case.attention.skip_softmax_threshold_scale_factor is not None
    )


def apply_reruns(m: Member) -> None:
    """Each of ``m``'s determinism reruns laid over its path's final verdict: kept when the
    rerun gave the same bits, NONDETERMINISTIC when other bits, the rerun's own result when
    it gave none."""
    for name, (again, rerun) in m.reruns.items():
        m.results[name] = _determinism(m.results[name], m.outputs[name][0], again, rerun)


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


def settle(members: list[Member], dev: torch.device, tol: compare.Tolerance) -> None:
    """Each member's pairs, and its final verdicts.

    A launch judged against the absolute allowances alone (the noise floors not measured)
    keeps every AGREE: each bound holds its allowance, so an error within the allowance is
    within the bound. Only a path over its allowance, or a pair of paths over their two,
    needs the floors: they are then measured for that member alone, on its own batch (the
    bounds it gets alone, where a replay or a rerun measures them), and every verdict and
    pair of it that was not an agreement is judged again. Most launches agree within the
    allowance, which saves the oracle's float32 passes; a launch where one case fails
    measures them over that case, not over its partners (over the whole launch until Run
    48: in the launch that run traced the floors took about the float64 oracle's device
    time, and their float32 gathers of every case's K and V ran launches out of memory)."""
    pair_up_launch(members)
    needing = [m for m in members if not m.floors and _over_allowance(m)]
    for m in needing:
        clock = time.perf_counter()
        assert m.batch is not None and m.ref is not None
        with timing.phase("oracle"):
            lows = compare.low_outputs(m.batch, _precisions([m]), fused.batched_attention)
        with timing.phase("bounds"):
            _bounds([m], None, m.ref, lows, dev, tol)
        m.timings["oracle"] = m.timings.get("oracle", 0.0) + time.perf_counter() - clock
        clock = time.perf_counter()
        for name, (out, key) in m.outputs.items():
            first = m.results[name]
            if first.outcome is Outcome.AGREE:
                continue
            with timing.phase("judge"):
                again = compare.judge(name, m.batch, out, m.ref, m.bounds[key], m.within[key])
            m.results[name] = dataclasses.replace(
                again, seconds=first.seconds, backend=first.backend
            )
        m.timings["compare"] += time.perf_counter() - clock
    pair_up_launch(needing)  # the others' bounds, and so their pairs, are as they were


def _over_allowance(m: Member) -> bool:
    """Whether a judged path of ``m``, or a pair of them, failed its bound."""
    failed = any(m.results[name].outcome is not Outcome.AGREE for name in m.outputs)
    return failed or not all(p.agree for p in m.pairs)


def pair_up(m: Member) -> None:
    """``m.pairs``: every two judged paths' agreement, under the bounds ``m`` has now."""
    assert m.batch is not None
    clock = time.perf_counter()
    rows = m.batch.row_requests() if m.batch.is_ragged else None
    with timing.phase("pairs"):
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
            for x, y in itertools.combinations(m.outputs, 2)
        )
    m.timings["compare"] = m.timings.get("compare", 0.0) + time.perf_counter() - clock


def pair_up_launch(members: list[Member]) -> None:
    """:func:`pair_up` for every member of a launch: each two paths' agreements on all the
    members they both judged computed together and read back once
    (:func:`~difftest.judgement.tolerance.pair_agreements`); on a CPU a launch of one case
    is paired by :func:`pair_up`, which is faster there (no device round trips to save, and
    no concatenation or scatter: 29 against 47 us a pair on a small case)."""
    if not members:
        return
    first = members[0].batch
    assert first is not None
    if len(members) == 1 and first.device.type == "cpu":
        pair_up(members[0])
        return
    clock = time.perf_counter()
    wanted: dict[tuple[str, str], list[Member]] = {}
    for m in members:
        for x, y in itertools.combinations(m.outputs, 2):
            wanted.setdefault((x, y), []).append(m)
    found: dict[tuple[int, str, str], PairAgreement] = {}
    with timing.phase("pairs"):
        for (x, y), both in wanted.items():
            parts = []
            for m in both:
                assert m.batch is not None
                (a, key_a), (b, key_b) = m.outputs[x], m.outputs[y]
                parts.append(
                    compare.PairPart(
                        a, b, m.case.batch.new_tokens(), m.bounds[key_a], m.bounds[key_b]
                    )
                )
            for m, agreement in zip(both, compare.pair_agreements(x, y, parts), strict=True):
                found[id(m), x, y] = agreement
    for m in members:
        m.pairs = tuple(found[id(m), x, y] for x, y in itertools.combinations(m.outputs, 2))
    timing.share(members, "compare", time.perf_counter() - clock)
