"""The shrink loop: rerun the finding, then apply reduction passes to a fixed point.

A candidate is accepted only when the finding's path shows the *same* signature on it (same
kind, same detail, same reference); failures of another kind met on the way are kept as
*slips* and never followed. Passes run cheapest first (runtime shape: requests, lengths, pool,
values), then the expensive ones (a new compile variant on a GPU: ``L``, masks, dtypes, heads),
and the whole sequence repeats until no pass makes progress or the run or time budget is spent.
Candidates are built with ``Case.replace`` / ``dataclasses.replace``; one whose construction
raises :class:`~difftest.model.errors.InvalidCase`, or that the path does not support, is rejected
without a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from difftest.execution.executors import Executor, InProcessExecutor
from difftest.judgement.signature import Signature, signature_of
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths.registry import KernelPath, get_path
from difftest.reduction.passes import default_passes
from difftest.reduction.probe import BudgetExhausted, ShrinkPass
from difftest.reduction.report import ShrinkReport, Slip

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkOutcome:
    """Where a shrink ended: the smallest case with the finding's signature, every path's
    verdict on it, and the shrink report."""

    case: Case
    result: CaseResult
    report: ShrinkReport


class Shrinker(Protocol):
    """What a campaign calls to shrink a finding (:func:`shrink` with its budget bound)."""

    def __call__(self, case: Case, finding: PathResult, executor: Executor) -> ShrinkOutcome: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkBudget:
    """Limits of one shrink: runs of the path (the original rerun included) and wall time."""

    max_runs: int = 250
    max_seconds: float = 120.0


@dataclass(slots=True)
class _State:
    """What the loop knows: the current case and result, what was tried, what was spent."""

    signature: Signature
    path: KernelPath
    executor: Executor
    budget: ShrinkBudget
    check_determinism: bool
    case: Case
    result: CaseResult
    start: float = field(default_factory=time.monotonic)
    runs: int = 0
    unsupported: int = 0
    cache: dict[str, bool] = field(default_factory=dict)
    slips: dict[str, Slip] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    current_pass: str = ""
    exhausted: bool = False

    def spent(self) -> bool:
        elapsed = time.monotonic() - self.start
        return self.runs >= self.budget.max_runs or elapsed >= self.budget.max_seconds

    def run(self, case: Case) -> CaseResult:
        self.runs += 1
        return self.executor.evaluate(case, check_determinism=self.check_determinism)

    def probe(self, candidate: Case) -> bool:
        digest = candidate.digest()
        if digest == self.case.digest():
            return False
        known = self.cache.get(digest)
        if known is not None:
            return known
        if self.path.support(candidate, self.executor.device) is not None:
            self.unsupported += 1
            self.cache[digest] = False
            return False
        if self.spent():
            raise BudgetExhausted
        result = self.run(candidate)
        verdict = result.result_for(self.signature.path)
        ok = verdict is not None and signature_of(verdict) == self.signature
        self.cache[digest] = ok
        if ok:
            self.case, self.result = candidate, result
            self.accepted[self.current_pass] = self.accepted.get(self.current_pass, 0) + 1
        elif verdict is not None and verdict.outcome.is_finding:
            self.slips.setdefault(
                digest,
                Slip(
                    digest=digest,
                    signature=signature_of(verdict),
                    reason=verdict.reason,
                    size=candidate.size(),
                ),
            )
        return ok


def narrow(executor: Executor, path: str) -> tuple[Executor, bool]:
    """An executor that runs only ``path``, of the same kind as ``executor``.

    Returns ``(executor, owned)``: ``owned`` means the caller must close it. An executor that
    offers ``narrowed(paths)`` (the isolated one can) makes its own; an in-process one is
    rebuilt; anything else is used as is (it runs all its paths, and only ``path`` is read).
    """
    chosen = _find_path(executor, path)
    narrowed = getattr(executor, "narrowed", None)
    if callable(narrowed):
        return narrowed([chosen]), True
    if isinstance(executor, InProcessExecutor):
        return InProcessExecutor([chosen], executor.device, executor.tolerance), True
    return executor, False


def _find_path(executor: Executor, name: str) -> KernelPath:
    for p in executor.paths:
        if p.name == name:
            return p
    return get_path(name)


def shrink(
    case: Case,
    finding: PathResult,
    executor: Executor,
    *,
    budget: ShrinkBudget | None = None,
    passes: Sequence[ShrinkPass] | None = None,
) -> ShrinkOutcome:
    """Shrink ``case`` while ``finding``'s path keeps failing the same way.

    Matches :class:`Shrinker`. The outcome's :class:`ShrinkReport` says whether the original
    reproduced, the original and shrunk size (``Case.size()``) and digests, the runs and
    seconds spent, the passes that made progress, and the failures of other kinds met on the
    way (``slips``).
    """
    budget = budget or ShrinkBudget()
    passes = list(passes) if passes is not None else default_passes(finding.outcome)
    signature = signature_of(finding)
    start = time.monotonic()
    runner, owned = narrow(executor, finding.path)
    try:
        state = _State(
            signature=signature,
            path=_find_path(executor, finding.path),
            executor=runner,
            budget=budget,
            check_determinism=finding.outcome is Outcome.NONDETERMINISTIC,
            case=case,
            result=CaseResult(case_digest=case.digest(), results=(finding,)),
            start=start,
        )
        rerun = state.run(case)
        again = rerun.result_for(finding.path)
        if again is None or signature_of(again) != signature:
            message = (
                f"the original did not reproduce: {signature.describe()} first, "
                f"{signature_of(again).describe() if again else 'no result'} on the rerun"
                + (f" ({again.reason})" if again is not None and again.reason else "")
            )
            report = _report(case, state, start, reproduced=False, message=message)
            return ShrinkOutcome(case=case, result=state.result, report=report)
        state.result = rerun
        _fixed_point(state, passes)
        result = state.result
        if owned and len(executor.paths) > 1 and not state.spent():
            # Every path's verdict on the shrunk case, for the repro; kept only if the
            # finding's path still shows the signature there.
            state.runs += 1
            full = executor.evaluate(state.case, check_determinism=state.check_determinism)
            verdict = full.result_for(finding.path)
            if verdict is not None and signature_of(verdict) == signature:
                result = full
        report = _report(case, state, start, reproduced=True)
        return ShrinkOutcome(case=state.case, result=result, report=report)
    finally:
        if owned:
            runner.close()


def _fixed_point(state: _State, passes: Sequence[ShrinkPass]) -> None:
    cheap = [p for p in passes if not p.expensive]
    costly = [p for p in passes if p.expensive]
    try:
        while True:
            progress = _sweep(state, cheap)
            while progress:
                progress = _sweep(state, cheap)
            if not _sweep(state, costly):
                return
    except BudgetExhausted:
        state.exhausted = True
        log.info("shrink budget spent after %d runs", state.runs)


def _sweep(state: _State, passes: Sequence[ShrinkPass]) -> bool:
    """One run of each pass; ``True`` when any made the case smaller."""
    progress = False
    for p in passes:
        before = state.case.digest()
        state.current_pass = p.name
        p.run(state.case, state.probe)
        progress |= state.case.digest() != before
    return progress


def _report(
    original: Case, state: _State, start: float, *, reproduced: bool, message: str = ""
) -> ShrinkReport:
    return ShrinkReport(
        reproduced=reproduced,
        signature=state.signature,
        original_size=original.size(),
        shrunk_size=state.case.size(),
        original_digest=original.digest(),
        shrunk_digest=state.case.digest(),
        runs=state.runs,
        rejected_unsupported=state.unsupported,
        seconds=time.monotonic() - start,
        max_runs=state.budget.max_runs,
        max_seconds=state.budget.max_seconds,
        exhausted=state.exhausted,
        passes=dict(state.accepted),
        slips=tuple(state.slips.values()),
        message=message,
    )
