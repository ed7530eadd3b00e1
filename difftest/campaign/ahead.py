"""A campaign's side of compiling ahead (:mod:`difftest.execution.compile_ahead`): before a
launch, queue the builds it needs and those of the variants coming after it, and wait for its
own (each build is waited for ``CampaignConfig.patience_s`` at most, from when a launch first
needs it); past the patience, the paths whose module is still building judge the launch later
(a deferred launch), run as soon as their module is built. Also the lookahead that shows a
fixed case list's coming compile variants, and the sum of what compile-ahead did.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from difftest.campaign.keeping import Keeper
from difftest.campaign.planning import MAX_DEFERRED, CampaignConfig
from difftest.campaign.report import AheadStats, Tally
from difftest.execution.built_modules import BuildKey
from difftest.execution.compile_ahead import CompileAhead
from difftest.execution.executors import BudgetSpent
from difftest.execution.launches import judge_launch
from difftest.execution.session import Session
from difftest.model.case import Case
from difftest.records.run_dir import RunDirectory
from difftest.triage.groups import Triage


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
class BuildWaits:
    """The builds a campaign's launches wait for, and the launches judged later for want of
    a path's module."""

    config: CampaignConfig
    session: Session
    out: RunDirectory
    triage: Triage
    tally: Tally
    keeper: Keeper
    """Keeps the findings of a deferred launch, once judged."""
    ahead: CompileAhead
    upcoming: Callable[[], list[Case]] = lambda: []
    """The cases (one per compile variant) to build for next."""
    deferred: deque[_Deferred] = field(default_factory=deque)
    """Launches waiting for paths whose module was still building past the patience."""
    judged_later: Counter[str] = field(default_factory=Counter)
    never_judged: Counter[str] = field(default_factory=Counter)
    asked: dict[BuildKey, float] = field(default_factory=dict)
    """When a launch first waited for each build (its patience runs from then)."""

    def compile_ahead(self, cases: list[Case], patient: bool = True) -> list[BuildKey]:
        """Queue builds for ``cases`` and the variants after them, and wait for those
        ``cases`` need (``compile_wait``; the builds of later variants go on behind). Past
        the patience (``CampaignConfig.patience_s``): the builds still going, whose paths
        judge ``cases`` later (empty: every path runs now), as soon as some active path is
        ready to run ``cases`` meanwhile."""
        self.submit(cases)
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
        self.wait(cases, until)
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
            self.wait(cases, stop_at, first=True)

    def submit(self, cases: list[Case]) -> None:
        """Queue the builds ``cases`` need, then those of the variants their findings would
        be rechecked on, then those of the variants planned next."""
        clock = time.perf_counter()
        later = self.upcoming()
        # the variants these cases' findings would be rechecked on, right after them
        active = {p.name for p in self.session.active}
        resets = [r for case in cases for r in self.triage.resets_of(case, active)]
        self.tally.timings["draw"] += time.perf_counter() - clock
        self.ahead.submit([*cases, *resets, *later])

    def wait(self, cases: list[Case], until: float | None, first: bool = False) -> None:
        session = self.session
        self.tally.timings["compile_wait"] += self.ahead.wait_for(
            cases, until=until, stop=lambda: session.interrupts.stopping, first=first
        )

    def would_wait(self, needed: list[BuildKey], limit: float) -> bool:
        """Whether a launch needing the modules ``needed`` would wait for them now
        (:meth:`compile_ahead`'s rule, for one launch at a time)."""
        active = {p.name for p in self.session.active}
        held = {k[0] for k in self.ahead.still_building(needed) if k[0] in active}
        if not held:
            return False
        if len(self.deferred) >= MAX_DEFERRED or not active - held:
            return True  # it waits until its builds end (or the first of them, to run)
        return time.monotonic() < limit

    def defer(self, cases: list[Case], held: list[BuildKey]) -> None:
        """A launch the other paths have run, for the paths whose builds in ``held`` are
        still going to judge later (:meth:`run_deferred`)."""
        self.deferred.append(_Deferred(cases=cases, waiting=held))

    def run_deferred(self) -> bool:
        """Run each waiting launch on those of its paths whose module is now built; ``False``
        when the budget ended meanwhile."""
        active = {p.name for p in self.session.active}
        for entry in list(self.deferred):
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
                self.keeper.keep_launch(judged)
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
            self.wait(cases, step if stop_at is None else min(stop_at, step))
        for entry in self.deferred:
            for name in entry.paths:
                self.never_judged[name] += len(entry.cases)
        self.deferred.clear()

    def close(self, filled: int) -> AheadStats:
        """Stop the builds still going (exploration is over) and sum up what was built, what
        paths judged late or never for want of their module, and the ``filled`` cases run
        meanwhile."""
        ahead = self.ahead
        unfinished = ahead.pending()
        ahead.close()
        results = ahead.results
        return AheadStats(
            processes=ahead.processes,
            builds=len(results),
            work_s=ahead.work_s,
            unfinished=unfinished,
            failed=tuple(f"{r.path} {r.variant}: {r.error}" for r in results if r.error),
            judged_later=dict(sorted(self.judged_later.items())),
            never_judged=dict(sorted(self.never_judged.items())),
            cached=ahead.cached,
            filled=filled,
        )


MAX_LOOKAHEAD = 4096
"""Cases a fixed case list is read ahead, at most, to find the next compile variants."""


class Lookahead:
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
