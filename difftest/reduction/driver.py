"""The shrink loop: rerun the finding, then apply reduction passes to a fixed point.

A candidate is accepted only when the finding's path shows the *same* signature on it (same
kind, same detail, same reference) and, when the caller gives one, its ``accept`` test holds
too (the campaign's: the candidate is still the same group, not another bug met on the way).
Failures of another kind met on the way are kept as *slips* and never followed. Passes run
cheapest first (runtime shape: requests, lengths, pool, values), then the expensive ones (a
new compile variant on a GPU: ``L``, masks, dtypes, heads), and the whole sequence repeats
until no pass makes progress or the run or time budget is spent. Candidates are built with
``Case.replace`` / ``dataclasses.replace``; one whose construction raises
:class:`~difftest.model.errors.InvalidCase`, or that the path does not support, is rejected
without a run. Only the finding's path runs (``only=``), in the executor it was found with.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from difftest.execution.executors import BudgetSpent, Executor
from difftest.judgement.signature import Signature, signature_of
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths.registry import KernelPath, get_path
from difftest.reduction.passes import default_passes
from difftest.reduction.probe import BudgetExhausted, ShrinkPass
from difftest.reduction.report import ShrinkReport, Slip

log = logging.getLogger(__name__)

BUDGET_ENDED = "the budget ended before the original's rerun finished"
"""A shrink report's message when nothing could be run."""

Accept = Callable[[Case, PathResult], bool]
"""``accept(candidate, verdict)``: an extra condition a same-signature candidate must meet."""

ShrinkProgress = Callable[[int, int, str], None]
"""``progress(runs, size, pass_name)``: called after each candidate, with the runs spent so
far, the size of the smallest failing case and the pass that is running."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkBudget:
    """Limits of one shrink: runs of the path (the original rerun included) and wall time
    (``inf``: runs only, as the self-test counts). The executor's ``stop_at`` (the command's
    budget) bounds it too."""

    max_runs: int = 250
    max_seconds: float = 120.0


class Prober:
    """Runs candidates of one finding through its path and says whether each keeps the
    finding (``True``), loses it (``False``) or cannot be run (``None``: invalid for the case
    model or unsupported by the path). Every answer is cached by case digest, so the ablation
    after a shrink (:mod:`difftest.triage.trigger`) costs only the candidates the shrink did
    not already try."""

    def __init__(
        self,
        signature: Signature,
        executor: Executor,
        budget: ShrinkBudget,
        *,
        check_determinism: bool = False,
        accept: Accept | None = None,
    ) -> None:
        self.signature = signature
        self.executor = executor
        self.budget = budget
        self.check_determinism = check_determinism
        self.accept = accept
        self.path: KernelPath = next(
            (p for p in executor.paths if p.name == signature.path), None
        ) or get_path(signature.path)
        self.start = time.monotonic()
        self.runs = 0
        self.unsupported = 0
        self.answers: dict[str, bool | None] = {}
        self.results: dict[str, CaseResult] = {}
        self.slips: dict[str, Slip] = {}

    def spent(self) -> bool:
        if self.runs >= self.budget.max_runs:
            return True
        now = time.monotonic()
        if now - self.start >= self.budget.max_seconds:
            return True
        stop_at = self.executor.stop_at
        return stop_at is not None and now >= stop_at

    def run(self, case: Case) -> CaseResult:
        """One run of the finding's path on ``case`` (counted against the budget). The run
        itself ends at the shrink's time limit: a candidate that crashes (a worker to start
        again) or hangs cannot take the shrink far past its seconds."""
        self.runs += 1
        outer = self.executor.stop_at
        if math.isfinite(self.budget.max_seconds):
            own = self.start + self.budget.max_seconds
            self.executor.stop_at = own if outer is None else min(outer, own)
        try:
            result = self.executor.evaluate(
                case, check_determinism=self.check_determinism, only=[self.signature.path]
            )
        except BudgetSpent:
            raise BudgetExhausted from None
        finally:
            self.executor.stop_at = outer
        self.results[case.digest()] = result
        return result

    def check(self, candidate: Case) -> bool | None:
        """Whether ``candidate`` keeps the finding (see the class docstring); raises
        :class:`BudgetExhausted` when a run is needed and the budget is spent."""
        digest = candidate.digest()
        if digest in self.answers:
            return self.answers[digest]
        if self.path.support(candidate, self.executor.device) is not None:
            self.unsupported += 1
            self.answers[digest] = None
            return None
        if self.spent():
            raise BudgetExhausted
        verdict = self.run(candidate).result_for(self.signature.path)
        same = verdict is not None and signature_of(verdict) == self.signature
        ok = (
            verdict is not None
            and same
            and (self.accept is None or self.accept(candidate, verdict))
        )
        self.answers[digest] = ok
        if not ok and verdict is not None and verdict.outcome.is_finding:
            self.slips.setdefault(
                digest,
                Slip(
                    digest=digest,
                    signature=signature_of(verdict),
                    reason=verdict.reason if not same else "another group: " + verdict.reason,
                    size=candidate.size(),
                ),
            )
        return ok


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkOutcome:
    """Where a shrink ended: the smallest case with the finding's signature, the path's
    verdict on it, the shrink report, and the prober (its cache serves the ablation)."""

    case: Case
    result: CaseResult
    report: ShrinkReport
    prober: Prober | None = None


class Shrinker(Protocol):
    """What a campaign calls to shrink a finding (:func:`shrink` with its budget bound)."""

    def __call__(self, case: Case, finding: PathResult, executor: Executor) -> ShrinkOutcome: ...


@dataclass(slots=True)
class _State:
    """What the loop knows: the current case and result, and which pass is running."""

    prober: Prober
    case: Case
    result: CaseResult
    accepted: dict[str, int] = field(default_factory=dict)
    current_pass: str = ""
    exhausted: bool = False
    progress: ShrinkProgress | None = None

    def probe(self, candidate: Case) -> bool:
        if candidate.digest() == self.case.digest():
            return False
        ok = self.prober.check(candidate) is True
        if ok:
            self.case, self.result = candidate, self.prober.results[candidate.digest()]
            self.accepted[self.current_pass] = self.accepted.get(self.current_pass, 0) + 1
        if self.progress is not None:
            self.progress(self.prober.runs, self.case.size(), self.current_pass)
        return ok


def shrink(
    case: Case,
    finding: PathResult,
    executor: Executor,
    *,
    budget: ShrinkBudget | None = None,
    passes: Sequence[ShrinkPass] | None = None,
    accept: Accept | None = None,
    progress: ShrinkProgress | None = None,
) -> ShrinkOutcome:
    """Shrink ``case`` while ``finding``'s path keeps failing the same way (and ``accept``
    holds).

    Matches :class:`Shrinker`. The outcome's :class:`ShrinkReport` says whether the original
    reproduced, the original and shrunk size (``Case.size()``) and digests, the runs and
    seconds spent, the passes that made progress, and the failures of other kinds met on the
    way (``slips``).
    """
    budget = budget or ShrinkBudget()
    passes = list(passes) if passes is not None else default_passes(finding.outcome)
    signature = signature_of(finding)
    prober = Prober(
        signature,
        executor,
        budget,
        check_determinism=finding.outcome is Outcome.NONDETERMINISTIC,
        accept=accept,
    )
    state = _State(
        prober=prober,
        case=case,
        result=CaseResult(case_digest=case.digest(), results=(finding,)),
        progress=progress,
    )
    try:
        rerun = prober.run(case)
    except BudgetExhausted:
        report = _report(case, state, reproduced=False, message=BUDGET_ENDED)
        return ShrinkOutcome(case=case, result=state.result, report=report, prober=prober)
    again = rerun.result_for(finding.path)
    prober.answers[case.digest()] = again is not None and signature_of(again) == signature
    if again is None or signature_of(again) != signature:
        message = (
            f"the original did not reproduce: {signature.describe()} first, "
            f"{signature_of(again).describe() if again else 'no result'} on the rerun"
            + (f" ({again.reason})" if again is not None and again.reason else "")
        )
        report = _report(case, state, reproduced=False, message=message)
        return ShrinkOutcome(case=case, result=state.result, report=report, prober=prober)
    state.result = rerun
    _fixed_point(state, passes)
    report = _report(case, state, reproduced=True)
    return ShrinkOutcome(case=state.case, result=state.result, report=report, prober=prober)


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
        log.info("shrink budget spent after %d runs", state.prober.runs)


def _sweep(state: _State, passes: Sequence[ShrinkPass]) -> bool:
    """One run of each pass; ``True`` when any made the case smaller."""
    progress = False
    for p in passes:
        before = state.case.digest()
        state.current_pass = p.name
        p.run(state.case, state.probe)
        progress |= state.case.digest() != before
    return progress


def _report(original: Case, state: _State, *, reproduced: bool, message: str = "") -> ShrinkReport:
    prober = state.prober
    return ShrinkReport(
        reproduced=reproduced,
        signature=prober.signature,
        original_size=original.size(),
        shrunk_size=state.case.size(),
        original_digest=original.digest(),
        shrunk_digest=state.case.digest(),
        runs=prober.runs,
        rejected_unsupported=prober.unsupported,
        seconds=time.monotonic() - prober.start,
        max_runs=prober.budget.max_runs,
        max_seconds=prober.budget.max_seconds if math.isfinite(prober.budget.max_seconds) else None,
        exhausted=state.exhausted,
        passes=dict(state.accepted),
        slips=tuple(prober.slips.values()),
        message=message,
    )
