"""The exploration loop of one launch at a time: each launch runs while the one before it is
accounted for, triaged and recorded (:class:`~difftest.execution.parallel.BackgroundLaunch`:
with an isolated worker the parent's work hides behind the worker's), and while the next one
is drawn; with ``CampaignConfig.fill``, extra variations run while a launch would wait for its
modules (:mod:`~difftest.campaign.filling`). A launch cut off by the end of the budget is left
unjudged; an interrupt stops after the launch in flight (a second abandons it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass

from difftest.campaign.exploration import Exploration, Progress, StopWhen
from difftest.execution import packing
from difftest.execution.built_modules import BuildKey
from difftest.execution.executors import BudgetSpent
from difftest.execution.parallel import Ran
from difftest.execution.session import BUDGET_SPENT
from difftest.model.case import Case


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
class SequentialLoop:
    """Runs an exploration one launch at a time, the next begun behind the last."""

    exploration: Exploration
    in_flight: _InFlight | None = None
    """The launch started and not yet accounted for."""

    def explore(
        self,
        launches: Iterator[list[tuple[int, Case]]],
        progress: Progress | None,
        stop_when: StopWhen | None = None,
    ) -> None:
        """Run launches until something stops it, then account for the one still in
        flight; on a second signal or an error, abandon it."""
        try:
            self._explore(launches, progress, stop_when)
            self._finish_in_flight(progress, stop_when)
        except BaseException:  # a second signal, or an error: nothing more is accounted
            if self.in_flight is not None:
                self.in_flight = None
                self.exploration.session.abandon_launch()
            raise

    @property
    def started(self) -> int:
        """Cases counted so far, and those of the launch in flight."""
        flying = self.in_flight
        return self.exploration.tally.cases + (len(flying.cases) if flying is not None else 0)

    def _explore(
        self,
        launches: Iterator[list[tuple[int, Case]]],
        progress: Progress | None,
        stop_when: StopWhen | None = None,
    ) -> None:
        """One launch at a time, each started before the one before it is accounted for
        (:meth:`_launch`); the last one started is left in :attr:`in_flight`."""
        exploration = self.exploration
        start = time.monotonic()
        while True:
            stop = exploration.no_further_launch(self.started)
            if stop is not None:
                exploration.stop_reason = stop
                return
            if exploration.builds is not None and not exploration.builds.run_deferred():
                exploration.stop_reason = BUDGET_SPENT
                return
            group = next(launches, None)
            if group is None:
                exploration.stop_reason = "the case list ended"
                return
            cases = [case for _, case in group]
            if exploration.filler is not None and self._fill_while_building(
                cases, progress, stop_when, start
            ):
                return
            if self._launch(group, progress, stop_when, start):
                return
            if exploration.filler is not None:
                exploration.filler.met(cases[-1])

    def _launch(
        self,
        group: list[tuple[int, Case]],
        progress: Progress | None,
        stop_when: StopWhen | None,
        start: float,
        *,
        extra: bool = False,
    ) -> bool:
        """Start one launch (``extra``: of :meth:`Filler.next_extra`), then account for the
        one before it: the launch runs while its predecessor's verdicts are triaged and
        recorded, and while the next one is drawn. Its cases, write-ahead entry and compile
        waits come first (:meth:`Exploration.begin`), while the launch before it still runs.
        A launch that ran at once (in process) is accounted for before anything of the next
        one: nothing runs meanwhile, and a stop rule its accounting meets starts nothing
        more. ``True`` when the exploration ends (:attr:`Exploration.stop_reason` says
        why)."""
        exploration = self.exploration
        session = exploration.session
        before = self.in_flight  # until it has ended, a second signal abandons it
        if before is not None and not session.launches_in_background:
            self.in_flight = None  # it ran at once: as a loop of one launch at a time would
            if self._finish(before, progress, stop_when):
                return True
            before = None
        cases, token, check, held = exploration.begin(group, self.started, extra=extra)
        only: list[str] | None = None
        if held:  # the paths whose module is still building judge these cases later
            later = {k[0] for k in held}
            only = [p.name for p in session.active if p.name not in later]
        if before is not None:
            # written behind the running launch: its worker starts this one as soon as it
            # answers that one, while this process accounts for it
            session.write_ahead(cases, check, only)
            try:
                wait([before.future])
            except BaseException:
                exploration.out.end(token, "cut")  # begun here, never started
                raise
            if before.future.exception() is not None:  # it ends the run: start nothing more
                self.in_flight = None
                exploration.out.end(token, "cut")
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
        exploration = self.exploration
        try:
            ran = launch.future.result()
        except BudgetSpent:
            exploration.out.end(launch.token, "cut")
            exploration.stop_reason = BUDGET_SPENT
            return True
        judged = exploration.session.account_launch(ran, launch.only)
        if launch.held:
            assert exploration.builds is not None  # only compile-ahead holds a launch's paths
            exploration.builds.defer(launch.cases, launch.held)
        if launch.extra:
            assert exploration.filler is not None  # only filling runs extra launches
            exploration.filler.filled += len(launch.cases)
        return exploration.accept(judged, launch.token, progress, stop_when, launch.start)

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
        if self.exploration.found:
            self.exploration.out.end(launch.token, "cut")
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
        :meth:`BuildWaits.compile_ahead` waits: within the patience, or while no active path
        is ready), run extra variations of variants whose modules are built instead of
        waiting; ``True`` when the exploration ends meanwhile. Nothing built yet (the
        campaign's first variant): the launch waits as before."""
        exploration = self.exploration
        builds, filler = exploration.builds, exploration.filler
        assert builds is not None and filler is not None
        builds.submit(cases)
        needed = builds.ahead.keys(cases)
        now = time.monotonic()
        asked = [builds.asked.setdefault(k, now) for k in builds.ahead.still_building(needed)]
        limit = max(asked, default=now) + exploration.config.patience_s
        while builds.would_wait(needed, limit):
            stop = exploration.no_further_launch(self.started)
            if stop is not None:
                exploration.stop_reason = stop
                return True
            launch = filler.next_extra()
            if launch is None:
                return False
            # split as planned launches are: eight large cases may overfill one launch
            for part in packing.group_for_launches(launch, max(1, exploration.config.pack)):
                if self._launch([(-1, c) for c in part], progress, stop_when, start, extra=True):
                    return True
        return False
