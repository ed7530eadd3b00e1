"""When a campaign shrinks, and what: a group waiting for its shrink is shrunk as soon as it
appears (so its trigger can be avoided from then on) as long as shrinking has used less than
its share of the budget; once no further case may start, what is left of the budget goes to
the groups still waiting, fewest shrinks first. A known bug that its corpus entry expects here
is not shrunk while cases are drawn (its entry holds the minimal repro), only with what is left
at the end. A shrunk group is established (its trigger found by ablation) and its repro
rewritten (:class:`~difftest.campaign.keeping.Keeper`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from difftest.campaign.keeping import Keeper
from difftest.campaign.planning import CampaignConfig
from difftest.campaign.report import Tally
from difftest.execution.compile_ahead import CompileAhead
from difftest.execution.executors import BudgetSpent
from difftest.execution.session import Session
from difftest.model.case import Case
from difftest.model.outcome import CaseResult
from difftest.reduction import ShrinkBudget, shrink
from difftest.reduction.driver import BUDGET_ENDED, Accept
from difftest.triage.features import labels
from difftest.triage.groups import MAX_SHRINKS, Group, Triage
from difftest.triage.trigger import Trigger, ablate

MIN_SHRINK_S = 1.0
"""A shrink starts only with at least this many seconds of allowance (less would be spent on
the original's rerun alone)."""


@dataclass(slots=True)
class ShrinkScheduler:
    """Shrinks the groups waiting for it, within shrinking's share of the budget."""

    config: CampaignConfig
    session: Session
    triage: Triage
    tally: Tally
    keeper: Keeper
    """Rechecks a shrink's candidates and rewrites a shrunk group's repro."""
    ahead: CompileAhead | None = None
    """The campaign's compile-ahead, if any: a minimal case is not run on a path whose module
    for it is still building."""
    shrink_s: float = 0.0
    """Seconds spent shrinking so far."""

    def shrink_allowance(self, final: bool) -> float:
        """Seconds shrinking may take now. While cases are still being drawn, shrinking keeps
        to its share of the time elapsed so far (so a finding on the first case does not
        starve the rest of the run); at the end it has what is left of the budget."""
        budget = self.session.budget
        if budget.total_s is None:
            return self.config.shrink_seconds
        if final:
            return budget.remaining()
        share = budget.shrink_share
        return min(budget.remaining(), share * budget.elapsed() - self.shrink_s)

    def may_shrink(self, final: bool) -> bool:
        if not self.config.shrink or self.session.interrupted or self.session.budget.spent():
            return False
        floor = min(MIN_SHRINK_S, self.session.budget.remaining())
        return self.shrink_allowance(final) >= floor

    def shrink_waiting(self, final: bool) -> None:
        while self.may_shrink(final):
            group = self.triage.next_to_shrink(exploring=not final)
            if group is None:
                return
            self.session.drain()  # the launch running on the executor ends first (not shrink)
            clock = time.perf_counter()
            try:
                self.shrink_group(group, final)
            finally:
                spent = time.perf_counter() - clock
                self.shrink_s += spent
                self.tally.timings["shrink"] += spent

    def shrink_group(self, group: Group, final: bool) -> None:
        rep = group.representative
        signature = group.signature
        executor = self.session.executor()
        budget = ShrinkBudget(
            max_runs=self.config.shrink_runs,
            max_seconds=max(0.0, min(self.config.shrink_seconds, self.shrink_allowance(final))),
        )
        # The candidate must not be another established group's bug (no sliding).
        accept: Accept = self.triage.accept_for(signature, self.keeper.recheck)
        # An earlier shrink that ran out of budget is continued from where it stopped.
        resume = group.exhausted and group.minimal is not None and group.minimal_result
        start = group.minimal if resume and group.minimal is not None else rep.case
        verdict = group.minimal_result if resume and group.minimal_result else rep.result
        outcome = shrink(start, verdict, executor, budget=budget, accept=accept)
        group.shrinks += 1
        group.shrink_runs += outcome.report.runs
        group.exhausted = outcome.report.exhausted
        if not outcome.report.reproduced:
            if outcome.report.message == BUDGET_ENDED or group.shrinks < MAX_SHRINKS:
                return  # the budget ended, or a flaky rerun: the group waits as it was
            # It never reproduces: keep it as found; as a group it claims no other finding
            # (its trigger: every feature it has).
            group.minimal, group.minimal_result = rep.case, rep.result
            found = Trigger(labels=(), untested=labels(rep.case))
        else:
            group.minimal = outcome.case
            group.minimal_result = outcome.result.result_for(signature.path)
            found = ablate(outcome.case, outcome.prober) if outcome.prober else Trigger(labels=())
            if found.untested and group.shrinks < MAX_SHRINKS:
                group.exhausted = True  # the ablation was cut short: resume it later
                if not group.established:
                    self.keeper.write_group(group, None, outcome.report)
                    return
        if not group.established:
            pool_repro = group.repro
            group = self.triage.establish(group, found, self.keeper.recheck)
            if pool_repro and pool_repro != group.repro:
                Path(pool_repro).unlink(missing_ok=True)  # joined a group with a smaller case
        elif group.known is None and not found.untested:
            # a continued shrink: its smaller case may need smaller sizes
            merged = group
            group = self.triage.retrigger(group, found)
            if group is not merged and merged.repro and merged.repro != group.repro:
                Path(merged.repro).unlink(missing_ok=True)  # its findings moved to ``group``
        full = self._all_paths(group.minimal or rep.case)
        if full is not None:
            group.other_paths.update(r.path for r in full.findings() if r.path != signature.path)
        self.keeper.write_group(
            group,
            full if full is not None and full.result_for(signature.path) else None,
            outcome.report,
        )

    def _all_paths(self, case: Case) -> CaseResult | None:
        """Every active path's verdict on a minimal case (for its repro and its group's
        "other paths"), unless the budget ended; a path whose module for it is still
        building is left out (it would build in the worker, and hold it up)."""
        building = self.ahead.building([case]) if self.ahead is not None else set()
        only = [p.name for p in self.session.active if p.name not in building]
        try:
            return self.session.executor().evaluate(case, only=only)
        except BudgetSpent:
            return None
