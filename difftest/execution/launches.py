"""Judge cases in packed launches without letting packing change a verdict.

:func:`judge_launch` runs the cases of one launch together (:mod:`difftest.execution.packing`). A
case
that is AGREE (or unsupported) everywhere keeps its packed verdict. Any other case is rerun
alone, and its verdict alone is the one kept, because that is what its repro replays. A path
that failed in the launch but agrees on the case alone is a *packed-only* finding: a kernel
that mixes up requests of one launch. It is kept with the whole launch, so it replays too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from difftest.model.case import Case
from difftest.model.outcome import CaseResult, PathResult

if TYPE_CHECKING:
    from difftest.execution.executors import Executor


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """One case's verdict from a launch."""

    case: Case
    result: CaseResult
    """Its verdict: from the launch, or from the rerun alone when the launch found anything."""
    launch: tuple[Case, ...]
    """The cases of the launch it ran in (itself alone: a launch of one)."""
    packed_only: tuple[PathResult, ...] = ()
    """Findings of the launch that the case alone does not show."""
    timings: dict[str, float] = field(default_factory=dict)
    """Time spent on this case, the launch's share and any rerun alone."""


def add_times(into: dict[str, float], more: Mapping[str, float]) -> None:
    """Add ``more``'s seconds to ``into``, activity by activity."""
    for key, seconds in more.items():
        into[key] = into.get(key, 0.0) + seconds


RunLaunch = Callable[[Sequence[Case], bool], list[CaseResult]]
"""``run(cases, check_determinism)``: each case's verdict from one launch of ``cases`` (one
case: run alone); :meth:`difftest.execution.session.Session.evaluate_launch`."""


def launch_results(
    executor: Executor,
    cases: Sequence[Case],
    check_determinism: bool,
    only: Sequence[str],
) -> list[CaseResult]:
    """Each case's verdict from one launch of ``cases`` on ``executor``'s paths ``only`` (one
    case: run alone; no path: an empty verdict each, nothing run)."""
    if not only:
        return [CaseResult(case_digest=c.digest(), results=()) for c in cases]
    if len(cases) == 1:
        return [executor.evaluate(cases[0], check_determinism=check_determinism, only=only)]
    return executor.evaluate_pack(cases, check_determinism=check_determinism, only=only)


Verdicts = tuple[CaseResult, CaseResult | None]
"""A case's verdict in its launch, and its verdict alone where it was rerun alone (``None``:
not rerun, and the launch's verdict is the case's)."""


def rerun_alone(
    run: RunLaunch, cases: Sequence[Case], check_determinism: bool = False
) -> list[Verdicts]:
    """Each case's verdict from one launch of ``cases``, and, when the launch held several
    cases, the verdict alone of each case whose verdict in it has a finding (rerun in launch
    order, after the launch). An isolated worker does this itself for a launch it is sent
    (:meth:`~difftest.execution.isolation.isolated.IsolatedExecutor.judge_pack`): one message
    a launch, reruns included."""
    launch = tuple(cases)
    packed = run(launch, check_determinism)
    if len(launch) == 1:
        return [(packed[0], None)]
    return [
        (result, run((case,), check_determinism)[0] if result.findings() else None)
        for case, result in zip(launch, packed, strict=True)
    ]


def judge_launch(
    run: RunLaunch, cases: Sequence[Case], *, check_determinism: bool = False
) -> list[Judged]:
    """Each case's verdict from one launch of ``cases`` (packable, in launch order)."""
    return judged_from(cases, rerun_alone(run, cases, check_determinism))


def judged_from(cases: Sequence[Case], verdicts: Sequence[Verdicts]) -> list[Judged]:
    """Each case's :class:`Judged` from its :data:`Verdicts` (:func:`rerun_alone`'s, or an
    executor's that reruns in its worker): the verdict alone where there is one, with the
    launch's findings that the case alone does not show; else the launch's verdict."""
    launch = tuple(cases)
    judged = []
    for case, (packed, alone) in zip(launch, verdicts, strict=True):
        timings = dict(packed.timings)
        if alone is None:
            judged.append(Judged(case=case, result=packed, launch=launch, timings=timings))
            continue
        add_times(timings, alone.timings)
        only = tuple(
            r
            for r in packed.findings()
            if not ((a := alone.result_for(r.path)) is not None and a.outcome.is_finding)
        )
        judged.append(
            Judged(case=case, result=alone, launch=launch, packed_only=only, timings=timings)
        )
    return judged
