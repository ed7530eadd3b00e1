"""The campaign: draw cases, run them through the session, triage every finding into its
group, shrink each group to its minimal case, and keep everything found.

One wall clock bounds all of it (the session's :class:`~difftest.execution.session.Budget`):
cases are drawn and run while the budget allows; a group waiting for its shrink is shrunk as
soon as it appears (so its trigger can be avoided from then on) as long as shrinking has used
less than its share of the budget; once no further case may start, what is left of the budget
goes to the groups still waiting, fewest shrinks first. A known bug that its corpus entry
expects here is not shrunk while cases are drawn (its entry holds the minimal repro), only with
what is left at the end. One launch at a time runs while the one before it is accounted
for, triaged and recorded (:class:`~difftest.execution.parallel.BackgroundLaunch`: with an
isolated worker the parent's work hides behind the worker's). A launch cut off by the end of
the budget is left unjudged; an interrupt stops after the launch in flight (a second abandons
it).

Every finding is appended to ``findings.jsonl`` as it is found, every group's representative
repro is written as soon as the group exists and rewritten once shrunk
(:mod:`difftest.records.run_dir`), so a killed campaign loses nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path

from difftest.campaign.planning import MAX_DEFERRED, CampaignConfig, Planner, PlanStats
from difftest.campaign.report import AheadStats, CampaignReport, FindingRecord, Tally
from difftest.execution import packing
from difftest.execution.built_modules import BuildKey, flashinfer_ledger
from difftest.execution.compile_ahead import CompileAhead
from difftest.execution.executors import BudgetSpent
from difftest.execution.health import PathUse, check_health
from difftest.execution.interrupts import interruptible
from difftest.execution.launches import Judged, judge_launch
from difftest.execution.parallel import LaunchPool, Ran
from difftest.execution.session import Session
from difftest.judgement.signature import Signature, signature_of
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Finding, PathResult
from difftest.records.repro import Repro, write_repro
from difftest.records.run_dir import LoggedFinding, RunDirectory
from difftest.reduction import ShrinkBudget, shrink
from difftest.reduction.driver import BUDGET_ENDED, Accept
from difftest.reduction.report import ShrinkReport
from difftest.triage.features import labels
from difftest.triage.groups import MAX_SHRINKS, Group, Member, Triage
from difftest.triage.trigger import Trigger, ablate

log = logging.getLogger(__name__)

MIN_SHRINK_S = 1.0
"""A shrink starts only with at least this many seconds of allowance (less would be spent on
the original's rerun alone)."""

MAX_UNJUDGED = 2
"""With a launch pool, launches started and not yet judged, per executor, at most (judging
keeps their order, so a slow launch holds back the judging of those after it)."""

Progress = Callable[[int, int, int, float], None]
"""``progress(cases, findings, groups, elapsed_s)`` after each launch."""
StopWhen = Callable[[Triage], bool]
"""``stop_when(triage)``, after each launch: ``True`` ends the exploration (the self-test stops
once the groups it looks for are established)."""


@dataclass(slots=True)
class _Deferred:
    """A launch the other paths have run, waiting for the builds in ``waiting`` (found once,
    when it was deferred: checking them is a lookup each, not the cases' support checks)."""

    cases: list[Case]
    waiting: list[BuildKey]

    @property
    def paths(self) -> set[str]:
        """The paths that have yet to judge the launch."""
        return {k[0] for k in self.waiting}


@dataclass(slots=True)
class _FillSource:
    """A compile variant extra variations are drawn for: a planned case of it, and how many
    extra launches were drawn for it so far."""

    case: Case
    drawn: int = 0


@dataclass(slots=True)
class _InFlight:
    """The launch the sequential loop started and has not accounted for yet
    (:meth:`Session.begin_launch`): it runs while the loop accounts for the one before."""

    future: Future[Ran]
    token: int
    cases: list[Case]
    held: list[BuildKey]
    """The builds the paths that judge it later wait for (empty: every active path runs it)."""
    only: list[str] | None
    extra: bool
    start: float
    """When the exploration began (for the progress line)."""


@dataclass(slots=True)
class _Run:
    """One campaign's moving parts."""

    config: CampaignConfig
    session: Session
    out: RunDirectory
    triage: Triage
    tally: Tally
    shrink_s: float = 0.0
    stop_reason: str = ""
    ahead: CompileAhead | None = None
    upcoming: Callable[[], list[Case]] = lambda: []
    """With :attr:`ahead`: the cases (one per compile variant) to build for next."""
    deferred: deque[_Deferred] = field(default_factory=deque)
    """Launches waiting for paths whose module was still building past the patience."""
    judged_later: Counter[str] = field(default_factory=Counter)
    never_judged: Counter[str] = field(default_factory=Counter)
    asked: dict[BuildKey, float] = field(default_factory=dict)
    """When a launch first waited for each build (its patience runs from then)."""
    rechecked: dict[tuple[str, Signature], bool | None] = field(default_factory=dict)
    """The answers :meth:`recheck_ahead` got for the launch being kept, by (case digest,
    signature)."""
    extra: Callable[[Case, int], list[Case]] | None = None
    """With :attr:`ahead` and ``CampaignConfig.fill``: launch ``k`` of the extra runtime
    variations of a case's compile variant (:meth:`Planner.extra`), run while the next
    launch's modules build."""
    in_flight: _InFlight | None = None
    """The sequential loop's launch started and not yet accounted for."""
    found: bool = False
    """``stop_when`` ended the exploration."""
    fill_sources: dict[tuple[object, ...], _FillSource] = field(default_factory=dict)
    """Per compile variant the planned launches met, in the order met (what
    :meth:`_next_extra` takes turns over)."""
    fill_turn: int = 0
    filled: int = 0
    """Cases of extra variations run while builds went on."""

    # -- running cases ------------------------------------------------------------------------

    def recheck(self, case: Case, signature: Signature) -> bool | None:
        """Whether ``case`` still fails with ``signature`` on its path (triage's one rerun):
        the answer :meth:`recheck_ahead` got for it, else one rerun now."""
        key = (case.digest(), signature)
        if key in self.rechecked:
            return self.rechecked.pop(key)
        clock, compiled = time.perf_counter(), self.session.recheck_compile_s
        try:
            return self.session.still_fails(case, signature)
        finally:
            self._rechecked_for(time.perf_counter() - clock, compiled)

    def _rechecked_for(self, seconds: float, compiled_before: float) -> None:
        """Count ``seconds`` of rechecks as triage, less what their first launches of a
        compile variant spent in the kernels (module builds and loads: compile, as a
        launch's first run of a variant is counted)."""
        compiled = self.session.recheck_compile_s - compiled_before
        self.tally.timings["compile"] += compiled
        self.tally.timings["triage"] += max(0.0, seconds - compiled)

    def recheck_ahead(self, judged: Sequence[Judged]) -> None:
        """Run the rechecks that triage will ask for the findings of one launch, together
        (:meth:`Session.still_fail`: in launches of up to the campaign's packing), and keep
        their answers for :meth:`recheck`. Two or more are needed to gain anything; a
        recheck triage asks only later (a group established meanwhile) runs then, alone."""
        wanted: dict[tuple[str, Signature], Case] = {}
        for j in judged:
            for finding in j.result.findings():
                signature = signature_of(finding)
                for case in self.triage.rechecks_for(j.case, signature):
                    wanted.setdefault((case.digest(), signature), case)
        if len(wanted) < 2 or self.config.pack < 2:
            return
        clock, compiled = time.perf_counter(), self.session.recheck_compile_s
        try:
            items = [(case, key[1]) for key, case in wanted.items()]
            answers = self.session.still_fail(items, self.config.pack)
            self.rechecked.update(zip(wanted, answers, strict=True))
        finally:
            self._rechecked_for(time.perf_counter() - clock, compiled)

    def keep_launch(self, judged: Sequence[Judged]) -> None:
        """:meth:`keep` every case of one launch, their rechecks run together first."""
        self.recheck_ahead(judged)
        try:
            for j in judged:
                self.keep(j)
        finally:
            self.rechecked.clear()

    def keep(self, judged: Judged) -> None:
        """Triage, log and (for a new group) write every finding of one case."""
        failing = [r.path for r in judged.result.findings()]
        index = self.tally.cases
        for finding in judged.result.findings():
            member = Member(
                case=judged.case,
                result=finding,
                other_paths=tuple(p for p in failing if p != finding.path),
                index=index,
            )
            group = self.triage.assign(member, self.recheck)
            self._note(member, group)
            if group.repro is None:
                self.write_group(group)
        for finding in judged.packed_only:
            self._packed_only(judged, finding, index)

    def _note(self, member: Member, group: Group) -> None:
        gid = group.record(self.tally.cases).id
        self.out.log(
            LoggedFinding(
                index=member.index,
                case=member.case,
                result=member.result,
                group=gid,
                other_paths=member.other_paths,
            )
        )
        self.tally.findings.append(
            FindingRecord(
                path=member.result.path,
                kind=member.result.outcome,
                detail=member.result.detail,
                reason=member.result.reason,
                case_digest=member.case.digest(),
                group=gid,
                index=member.index,
            )
        )

    def _packed_only(self, judged: Judged, finding: PathResult, index: int) -> None:
        """A finding only the packed launch shows (a kernel that mixes up the requests of one
        launch): kept with the whole launch, unshrunk (the shrinker works on one case)."""
        reason = f"only in a launch of {len(judged.launch)} packed cases: {finding.reason}"
        finding = dataclasses.replace(finding, reason=reason)
        repro = self._repro(
            judged.case,
            CaseResult(case_digest=judged.case.digest(), results=(finding,)),
            finding,
            launch=judged.launch,
        )
        name = f"{repro.file_name()[:-5]}-packed.json"
        file = write_repro(self.config.out_dir / "packed", repro, file_name=name)
        self.out.log(
            LoggedFinding(
                index=index,
                case=judged.case,
                result=finding,
                group="packed-only",
                launch=judged.launch,
            )
        )
        self.tally.findings.append(
            FindingRecord(
                path=finding.path,
                kind=finding.outcome,
                detail=finding.detail,
                reason=reason,
                case_digest=judged.case.digest(),
                group="packed-only",
                index=index,
                packed_only=True,
                repro=str(file),
            )
        )

    # -- repros -------------------------------------------------------------------------------

    def _repro(
        self,
        case: Case,
        result: CaseResult,
        finding: PathResult,
        *,
        shrink_report: ShrinkReport | None = None,
        launch: tuple[Case, ...] = (),
    ) -> Repro:
        return Repro(
            case=case,
            launch=launch,
            status="finding",
            paths=tuple(p.name for p in self.session.paths),
            finding=Finding(path=finding.path, kind=finding.outcome, reason=finding.reason),
            result=result,
            tolerance=self.session.settings.tolerance,
            environment=stamp(self.session.device),
            shrink=shrink_report,
            plugins=self.session.settings.plugins,
        )

    def write_group(
        self, group: Group, result: CaseResult | None = None, report: ShrinkReport | None = None
    ) -> None:
        """(Re)write ``group``'s representative repro: its minimal case once shrunk."""
        case = group.minimal or group.representative.case
        verdict = group.minimal_result or group.representative.result
        if result is None:
            result = CaseResult(case_digest=case.digest(), results=(verdict,))
        gid = group.record(self.tally.cases).id
        old = group.repro
        file = self.out.write_group(gid, self._repro(case, result, verdict, shrink_report=report))
        group.repro = str(file)
        if old and old != group.repro:
            Path(old).unlink(missing_ok=True)
        self.out.write_index(self.tally.cases, self.triage.records(self.tally.cases))

    # -- shrinking ----------------------------------------------------------------------------

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
        accept: Accept = self.triage.accept_for(signature, self.recheck)
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
                    self.write_group(group, None, outcome.report)
                    return
        if not group.established:
            pool_repro = group.repro
            group = self.triage.establish(group, found, self.recheck)
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
        self.write_group(
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

    # -- the loop -----------------------------------------------------------------------------

    def _compile_ahead(self, cases: list[Case], patient: bool = True) -> list[BuildKey]:
        """Queue builds for ``cases`` and the variants after them, and wait for those
        ``cases`` need (``compile_wait``; the builds of later variants go on behind). Past
        the patience (``CampaignConfig.patience_s``): the builds still going, whose paths
        judge ``cases`` later (empty: every path runs now), as soon as some active path is
        ready to run ``cases`` meanwhile."""
        assert self.ahead is not None
        self._submit(cases)
        session = self.session
        stop_at = session.budget.stop_at()
        patient = patient and len(self.deferred) < MAX_DEFERRED
        until = stop_at
        needed = self.ahead.keys(cases) if patient else []  # support checks once; then lookups
        if patient:  # each build is waited for patience_s once, from when a launch first needs it
            now = time.monotonic()
            asked = [self.asked.setdefault(k, now) for k in self.ahead.still_building(needed)]
            limit = max(asked, default=now) + self.config.patience_s
            until = limit if stop_at is None else min(stop_at, limit)
        self._wait(cases, until)
        if not patient:
            return []
        while True:
            active = {p.name for p in session.active}
            held = [k for k in self.ahead.still_building(needed) if k[0] in active]
            if not held or active - {k[0] for k in held}:
                return held
            # nothing to run meanwhile: wait for the first of the builds to end, not all
            if session.interrupts.stopping or (stop_at is not None and time.monotonic() >= stop_at):
                return []
            self._wait(cases, stop_at, first=True)

    def _submit(self, cases: list[Case]) -> None:
        """Queue the builds ``cases`` need, then those of the variants their findings would
        be rechecked on, then those of the variants planned next."""
        assert self.ahead is not None
        clock = time.perf_counter()
        later = self.upcoming()
        # the variants these cases' findings would be rechecked on, right after them
        active = {p.name for p in self.session.active}
        resets = [r for case in cases for r in self.triage.resets_of(case, active)]
        self.tally.timings["draw"] += time.perf_counter() - clock
        self.ahead.submit([*cases, *resets, *later])

    def _wait(self, cases: list[Case], until: float | None, first: bool = False) -> None:
        assert self.ahead is not None
        session = self.session
        self.tally.timings["compile_wait"] += self.ahead.wait_for(
            cases, until=until, stop=lambda: session.interrupts.stopping, first=first
        )

    def run_deferred(self) -> bool:
        """Run each waiting launch on those of its paths whose module is now built; ``False``
        when the budget ended meanwhile."""
        assert self.ahead is not None or not self.deferred
        active = {p.name for p in self.session.active}
        for entry in list(self.deferred):
            assert self.ahead is not None
            for name in entry.paths - active:  # quarantined meanwhile
                self.never_judged[name] += len(entry.cases)
            entry.waiting = [k for k in entry.waiting if k[0] in active]
            left = self.ahead.still_building(entry.waiting)
            ready = sorted(entry.paths - {k[0] for k in left})
            if ready:
                token = self.out.begin(entry.cases)
                try:
                    run = functools.partial(self.session.evaluate_launch, only=ready)
                    judged = judge_launch(run, entry.cases)
                except BudgetSpent:
                    self.out.end(token, "cut")
                    return False
                self.tally.add_later(judged)
                self.keep_launch(judged)
                self.out.end(token)
                for name in ready:
                    self.judged_later[name] += len(entry.cases)
                active = {p.name for p in self.session.active}
            entry.waiting = left
            if not entry.waiting:
                self.deferred.remove(entry)
        return True

    def finish_deferred(self) -> None:
        """Once no new launch starts: while the exploration may go on, wait for the waiting
        launches' builds and run them; count what no build came in time for."""
        session = self.session
        while self.deferred and session.should_stop() is None:
            if not self.run_deferred() or not self.deferred:
                break
            cases = [c for e in self.deferred for c in e.cases]
            stop_at = session.budget.stop_at()
            step = time.monotonic() + 1.0
            self._wait(cases, step if stop_at is None else min(stop_at, step))
        for entry in self.deferred:
            for name in entry.paths:
                self.never_judged[name] += len(entry.cases)
        self.deferred.clear()

    def explore(
        self,
        launches: Iterator[list[tuple[int, Case]]],
        progress: Progress | None,
        stop_when: StopWhen | None = None,
    ) -> None:
        """Run launches until something stops it (one at a time, or ``workers`` at once),
        then the launches still waiting for a path's module (:meth:`finish_deferred`)."""
        if self.config.workers > 1:
            self._explore_pooled(launches, progress, stop_when)
        else:
            try:
                self._explore(launches, progress, stop_when)
                self._finish_in_flight(progress, stop_when)
            except BaseException:  # a second signal, or an error: nothing more is accounted
                if self.in_flight is not None:
                    self.in_flight = None
                    self.session.abandon_launch()
                raise
        self.finish_deferred()

    @property
    def started(self) -> int:
        """Cases counted so far, and those of the launch in flight."""
        flying = self.in_flight
        return self.tally.cases + (len(flying.cases) if flying is not None else 0)

    def _explore(
        self,
        launches: Iterator[list[tuple[int, Case]]],
        progress: Progress | None,
        stop_when: StopWhen | None = None,
    ) -> None:
        """One launch at a time, each started before the one before it is accounted for
        (:meth:`_launch`); the last one started is left in :attr:`in_flight`."""
        start = time.monotonic()
        while True:
            stop = self._no_further_launch(self.started)
            if stop is not None:
                self.stop_reason = stop
                return
            if not self.run_deferred():
                self.stop_reason = "the budget is spent"
                return
            group = next(launches, None)
            if group is None:
                self.stop_reason = "the case list ended"
                return
            cases = [case for _, case in group]
            if self.extra is not None and self._fill_while_building(
                cases, progress, stop_when, start
            ):
                return
            if self._launch(group, progress, stop_when, start):
                return
            if self.extra is not None:
                self.fill_sources.setdefault(cases[-1].compile_variant(), _FillSource(cases[-1]))

    def _launch(
        self,
        group: list[tuple[int, Case]],
        progress: Progress | None,
        stop_when: StopWhen | None,
        start: float,
        *,
        extra: bool = False,
    ) -> bool:
        """Start one launch (``extra``: of :meth:`_next_extra`), then account for the one
        before it: the launch runs while its predecessor's verdicts are triaged and recorded,
        and while the next one is drawn. Its cases, write-ahead entry and compile waits come
        first (:meth:`_begin`), while the launch before it still runs. A launch that ran at
        once (in process) is accounted for before anything of the next one: nothing runs
        meanwhile, and a stop rule its accounting meets starts nothing more. ``True`` when
        the exploration ends (:attr:`stop_reason` says why)."""
        session = self.session
        before = self.in_flight  # until it has ended, a second signal abandons it
        if before is not None and not session.launches_in_background:
            self.in_flight = None  # it ran at once: as a loop of one launch at a time would
            if self._finish(before, progress, stop_when):
                return True
            before = None
        cases, token, check, held = self._begin(group, self.started, extra=extra)
        only: list[str] | None = None
        if held:  # the paths whose module is still building judge these cases later
            later = {k[0] for k in held}
            only = [p.name for p in session.active if p.name not in later]
        if before is not None:
            try:
                wait([before.future])
            except BaseException:
                self.out.end(token, "cut")  # begun here, never started
                raise
            if before.future.exception() is not None:  # it ends the run: start nothing more
                self.in_flight = None
                self.out.end(token, "cut")
                return self._finish(before, progress, stop_when)
        self.in_flight = _InFlight(
            future=session.begin_launch(cases, check, only),
            token=token,
            cases=cases,
            held=held,
            only=only,
            extra=extra,
            start=start,
        )
        return before is not None and self._finish(before, progress, stop_when)

    def _finish(
        self, launch: _InFlight, progress: Progress | None, stop_when: StopWhen | None
    ) -> bool:
        """Account for, triage and record a launch that has ended; ``True`` when the
        exploration ends (its budget ended while it ran, or ``stop_when``)."""
        try:
            ran = launch.future.result()
        except BudgetSpent:
            self.out.end(launch.token, "cut")
            self.stop_reason = "the budget is spent"
            return True
        judged = self.session.account_launch(ran, launch.only)
        if launch.held:
            self.deferred.append(_Deferred(cases=launch.cases, waiting=launch.held))
        if launch.extra:
            self.filled += len(launch.cases)
        return self._accept(judged, launch.token, progress, stop_when, launch.start)

    def _finish_in_flight(self, progress: Progress | None, stop_when: StopWhen | None) -> None:
        """Once no launch starts any more: wait for the one still running and account for it
        (an interrupt lets the launch in flight finish; the budget cuts it, unjudged). When
        ``stop_when`` ended the exploration, the launch started after the one that ended it
        is dropped (its write-ahead entry closed as cut), as a loop that starts a launch only
        after accounting for the last would never have run it."""
        launch = self.in_flight
        if launch is None:
            return
        wait([launch.future])  # until it has ended, a second signal abandons it
        self.in_flight = None
        if self.found:
            self.out.end(launch.token, "cut")
            return
        self._finish(launch, progress, stop_when)

    def _fill_while_building(
        self,
        cases: list[Case],
        progress: Progress | None,
        stop_when: StopWhen | None,
        start: float,
    ) -> bool:
        """Before the launch of ``cases``: while it would wait for its modules (as
        :meth:`_compile_ahead` waits: within the patience, or while no active path is ready),
        run extra variations of variants whose modules are built instead of waiting; ``True``
        when the exploration ends meanwhile. Nothing built yet (the campaign's first
        variant): the launch waits as before."""
        assert self.ahead is not None
        self._submit(cases)
        needed = self.ahead.keys(cases)
        now = time.monotonic()
        asked = [self.asked.setdefault(k, now) for k in self.ahead.still_building(needed)]
        limit = max(asked, default=now) + self.config.patience_s
        while self._would_wait(needed, limit):
            stop = self._no_further_launch(self.started)
            if stop is not None:
                self.stop_reason = stop
                return True
            launch = self._next_extra()
            if launch is None:
                return False
            # split as planned launches are: eight large cases may overfill one launch
            for part in packing.group_for_launches(launch, max(1, self.config.pack)):
                if self._launch([(-1, c) for c in part], progress, stop_when, start, extra=True):
                    return True
        return False

    def _would_wait(self, needed: list[BuildKey], limit: float) -> bool:
        """Whether a launch needing the modules ``needed`` would wait for them now
        (:meth:`_compile_ahead`'s rule, for one launch at a time)."""
        assert self.ahead is not None
        active = {p.name for p in self.session.active}
        held = {k[0] for k in self.ahead.still_building(needed) if k[0] in active}
        if not held:
            return False
        if len(self.deferred) >= MAX_DEFERRED or not active - held:
            return True  # it waits until its builds end (or the first of them, to run)
        return time.monotonic() < limit

    def _next_extra(self) -> list[Case] | None:
        """The next launch of extra variations: the variants met take turns, each only
        while every module it needs is built; ``None`` when no variant is."""
        assert self.ahead is not None and self.extra is not None
        clock = time.perf_counter()
        try:
            sources = list(self.fill_sources.values())
            for _ in range(len(sources)):
                source = sources[self.fill_turn % len(sources)]
                self.fill_turn += 1
                if not self.ahead.ready([source.case]):
                    continue
                launch = self.extra(source.case, source.drawn)
                source.drawn += 1
                if launch and self.ahead.ready(launch):  # avoidance may move a case off it
                    return launch
            return None
        finally:
            self.tally.timings["draw"] += time.perf_counter() - clock

    def _explore_pooled(
        self,
        launches: Iterator[list[tuple[int, Case]]],
        progress: Progress | None,
        stop_when: StopWhen | None,
    ) -> None:
        """:meth:`explore` with up to ``workers`` launches running at once
        (:class:`~difftest.execution.parallel.LaunchPool`), judged in the order started. The
        next launch is drawn while the others run and starts as soon as an executor is free;
        once the loop stops, the launches still running are dropped (their write-ahead
        entries closed as cut)."""
        session = self.session
        pool = session.launch_pool(self.config.workers)
        start = time.monotonic()
        running: deque[tuple[int, Future[Ran]]] = deque()
        started = self.tally.cases
        drawn: list[tuple[int, Case]] | None = None
        ended = False
        clean = False
        try:
            while True:
                if drawn is None and not ended and self._no_further_launch(started) is None:
                    drawn = next(launches, None)
                    ended = drawn is None
                if drawn is not None and pool.running < pool.width:
                    if len(running) < MAX_UNJUDGED * pool.width:
                        cases, token, check, _ = self._begin(drawn, started)
                        running.append((token, session.start_launch(pool, cases, check)))
                        started += len(cases)
                        drawn = None
                        continue
                if not running:
                    stop = self._no_further_launch(self.tally.cases)
                    self.stop_reason = stop or "the case list ended"
                    clean = True
                    return
                token, future = running[0]
                if not future.done():
                    # wake when any launch ends: a free executor takes the drawn launch
                    wait([f for _, f in running if not f.done()], return_when=FIRST_COMPLETED)
                    if not running[0][1].done():
                        continue
                running.popleft()
                try:
                    ran = future.result()
                except BudgetSpent:
                    self.out.end(token, "cut")
                    self.stop_reason = "the budget is spent"
                    clean = True
                    return
                if self._accept(session.account_launch(ran), token, progress, stop_when, start):
                    clean = True
                    return
                stop = self._no_further_launch(self.tally.cases)
                if stop is not None and running:
                    self.stop_reason = stop
                    clean = True
                    return
        finally:
            self._drop(running, pool, wait=clean)

    def _drop(
        self, running: deque[tuple[int, Future[Ran]]], pool: LaunchPool, *, wait: bool
    ) -> None:
        """Launches started but not to be judged: waited for (``wait``) and closed as cut in
        the write-ahead log; or, when the loop was abandoned (a second interrupt), the pool's
        workers are stopped and the launches left open there, as the sequential loop leaves
        the launch it abandons."""
        if not wait:
            pool.close()
            return
        for token, future in running:
            try:
                future.result()
            except Exception:  # a launch cut by the budget, or a worker that failed
                pass
            self.out.end(token, "cut")
        running.clear()

    def _no_further_launch(self, cases: int) -> str | None:
        """Why no launch may start after ``cases`` cases (``None``: one may)."""
        config = self.config
        if config.max_cases is not None and cases >= config.max_cases:
            return f"{config.max_cases} cases run"
        waiting = config.shrink and self.triage.next_to_shrink(exploring=True) is not None
        return self.session.should_stop(shrinking_pending=waiting)

    def _begin(
        self, group: list[tuple[int, Case]], cases_before: int, *, extra: bool = False
    ) -> tuple[list[Case], int, bool, list[BuildKey]]:
        """A launch about to start, after ``cases_before`` cases: its cases (cut to the case
        limit), its write-ahead entry, whether it checks determinism, and the paths that
        judge it later, as the builds they wait for (still going past the patience; one
        launch at a time only); its compile variants' builds waited for. ``extra``: a
        launch of extra variations (their indices are not the plan's: the determinism check
        counts them apart)."""
        config = self.config
        if config.max_cases is not None:
            group = group[: config.max_cases - cases_before]
        cases = [case for _, case in group]
        clock = time.perf_counter()
        token = self.out.begin(cases)
        self.tally.timings["record"] += time.perf_counter() - clock
        every = config.determinism_every
        indices = (
            list(range(self.filled, self.filled + len(cases)))
            if extra
            else [index for index, _ in group]
        )
        check = bool(every) and any(index % every == 0 for index in indices)
        held: list[BuildKey] = []
        if self.ahead is not None:
            held = self._compile_ahead(cases, patient=self.config.workers == 1)
        return cases, token, check, held

    def _accept(
        self,
        judged: list[Judged],
        token: int,
        progress: Progress | None,
        stop_when: StopWhen | None,
        start: float,
    ) -> bool:
        """Count, triage and record a judged launch, then shrink what waits; ``True`` when
        ``stop_when`` ends the exploration."""
        self.tally.add_launch(judged)
        if any(j.result.findings() or j.packed_only for j in judged):
            # triage reruns cases on the executor: first the launch running there ends (the
            # worker's time, counted in its phases, not in this launch's triage or record)
            self.session.drain()
        clock = time.perf_counter()
        timings = self.tally.timings
        rechecks = timings.get("triage", 0.0) + timings.get("compile", 0.0)
        self.keep_launch(judged)
        self.out.end(token)
        # triage's reruns inside keep() are counted as triage (or compile), not again as record
        rechecks = timings.get("triage", 0.0) + timings.get("compile", 0.0) - rechecks
        self.tally.timings["record"] += time.perf_counter() - clock - rechecks
        self.shrink_waiting(final=False)
        if stop_when is not None and stop_when(self.triage):
            self.stop_reason = "the campaign found what it was looking for"
            self.found = True
            return True
        if progress is not None:
            progress(
                self.tally.cases,
                len(self.tally.findings),
                len(self.triage.records(self.tally.cases)),
                time.monotonic() - start,
            )
        return False


def run_campaign(
    config: CampaignConfig,
    session: Session,
    *,
    progress: Progress | None = None,
    cases: Iterator[tuple[int, Case]] | None = None,
    suppress: tuple[str, ...] = (),
    stop_when: StopWhen | None = None,
    plan: PlanStats | None = None,
) -> CampaignReport:
    """Run cases until the case limit, the case list, the budget or an interrupt ends it;
    shrink and triage the findings; return the report. ``cases``: a fixed case list instead
    of the planner's (the suite's shards, bench's drawn-ahead cases); ``plan``: the
    statistics of the planner that drew them (what it avoided), for the report."""
    start = time.monotonic()
    session.spawn_early(config.workers)  # its start-up overlaps the planning below
    out = RunDirectory(config.out_dir)
    died = out.open()
    triage = Triage(config.known)
    run = _Run(
        config=config,
        session=session,
        out=out,
        triage=triage,
        tally=Tally(config=config, jit=session.device.type == "cuda"),
    )
    active = {p.name for p in session.runnable}
    planner = Planner(
        config,
        session.device,
        paths=session.runnable,
        triggers=lambda: triage.triggers_to_avoid(active),
    )
    fixed = _Lookahead(cases) if cases is not None else None
    source = _timed(fixed if fixed is not None else iter(planner), run.tally)
    launches = packing.group_for_launches(source, max(1, config.pack), case_of=lambda x: x[1])
    if config.compile_ahead > 0 and session.runnable:
        depth = 2 * config.compile_ahead
        run.ahead = CompileAhead(
            session.runnable,
            session.device,
            config.compile_ahead,
            plugins=tuple(session.settings.plugins),
            built=flashinfer_ledger() if session.device.type == "cuda" else None,
        )
        run.upcoming = (
            (lambda: fixed.variants(depth)) if fixed else (lambda: planner.upcoming(depth))
        )
        if config.fill and fixed is None and config.workers == 1:
            run.extra = planner.extra
    try:
        if session.runnable:
            interruptible(lambda: run.explore(launches, progress, stop_when), session.interrupts)
        else:
            run.stop_reason = "no chosen path can run here"
    finally:
        ahead = _close_ahead(run.ahead, run.judged_later, run.never_judged, run.filled)
    if not session.interrupted:
        interruptible(lambda: run.shrink_waiting(final=True), session.interrupts)
    for group in triage.groups:
        if group.members and group.repro is None:
            run.write_group(group)
    out.write_index(run.tally.cases, triage.records(run.tally.cases))
    wall = time.monotonic() - start
    uses = [
        PathUse(
            name=p.name,
            ran=(c := session.counters[p.name]).ran,
            skipped=c.skipped,
            skip_reasons=dict(c.skip_reasons),
            skip_seconds=c.skip_seconds,
            quarantined=session.quarantined[p.name].reason
            if p.name in session.quarantined
            else None,
            unavailable=session.unavailable.get(p.name),
        )
        for p in session.paths
    ]
    health = check_health(
        uses,
        cases=run.tally.cases,
        wall_s=wall,
        budget_s=session.budget.total_s,
        compile_s=run.tally.compile_s,
        suppress=suppress,
    )
    interrupted = session.interrupted
    final = {
        (m.case.digest(), m.result.path): g.record(run.tally.cases).id
        for g in triage.groups
        for m in g.members
    }
    run.tally.findings[:] = [
        dataclasses.replace(f, group=final.get((f.case_digest, f.path), f.group))
        for f in run.tally.findings
    ]
    return run.tally.snapshot(
        groups=triage.records(run.tally.cases),
        unavailable=session.unavailable,
        quarantined={n: q.reason for n, q in session.quarantined.items()},
        environment=stamp(session.device),
        wall_s=wall,
        interrupted=interrupted,
        stop_reason=f"interrupted ({session.interrupts.requested})"
        if interrupted
        else run.stop_reason,
        health=health,
        plan=plan if plan is not None else planner.stats,
        died=[c.digest() for c in died],
        path_names=[p.name for p in session.paths],
        compile_ahead=ahead,
    )


def _close_ahead(
    ahead: CompileAhead | None,
    judged_later: Counter[str],
    never_judged: Counter[str],
    filled: int = 0,
) -> AheadStats | None:
    """Stop the builds still going (exploration is over) and sum up what was built, what
    paths judged late or never for want of their module, and the cases run meanwhile."""
    if ahead is None:
        return None
    unfinished = ahead.pending()
    ahead.close()
    results = ahead.results
    return AheadStats(
        processes=ahead.processes,
        builds=len(results),
        work_s=ahead.work_s,
        unfinished=unfinished,
        failed=tuple(f"{r.path} {r.variant}: {r.error}" for r in results if r.error),
        judged_later=dict(sorted(judged_later.items())),
        never_judged=dict(sorted(never_judged.items())),
        cached=ahead.cached,
        filled=filled,
    )


MAX_LOOKAHEAD = 4096
"""Cases a fixed case list is read ahead, at most, to find the next compile variants."""


class _Lookahead:
    """A fixed case list (``(index, case)``) that can show the compile variants coming."""

    def __init__(self, source: Iterator[tuple[int, Case]]) -> None:
        self._source = source
        self._buffer: deque[tuple[int, Case]] = deque()

    def __iter__(self) -> Iterator[tuple[int, Case]]:
        return self

    def __next__(self) -> tuple[int, Case]:
        if self._buffer:
            return self._buffer.popleft()
        return next(self._source)

    def variants(self, count: int) -> list[Case]:
        """The first case of each of the next ``count`` compile variants, reading ahead."""
        firsts: dict[tuple[object, ...], Case] = {}
        for _, case in self._buffer:
            firsts.setdefault(case.compile_variant(), case)
        while len(firsts) < count and len(self._buffer) < MAX_LOOKAHEAD:
            item = next(self._source, None)
            if item is None:
                break
            self._buffer.append(item)
            firsts.setdefault(item[1].compile_variant(), item[1])
        return list(firsts.values())[:count]


def _timed(source: Iterator[tuple[int, Case]], tally: Tally) -> Iterator[tuple[int, Case]]:
    """``source``, with the time spent drawing each case counted as ``draw``."""
    while True:
        clock = time.perf_counter()
        item = next(source, None)
        tally.timings["draw"] += time.perf_counter() - clock
        if item is None:
            return
        yield item
