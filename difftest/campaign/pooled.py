"""The exploration loop of several launches at once (``CampaignConfig.workers`` > 1): up to
``workers`` launches run on a :class:`~difftest.execution.parallel.LaunchPool`, with a few
queued behind each (:data:`~difftest.execution.parallel.LANE_DEPTH`), judged in the order
started. With ``CampaignConfig.fill``, while the next planned launch's modules build, extra
variations of the variants already built are queued instead (:mod:`~difftest.campaign.
filling`), as the sequential loop does: the workers run them while the builds go on, where
before every worker ran dry behind the one wait.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import NamedTuple

from difftest.campaign.exploration import Exploration, Progress, StopWhen
from difftest.execution import packing
from difftest.execution.executors import BudgetSpent
from difftest.execution.parallel import LaunchPool, Ran
from difftest.execution.session import BUDGET_SPENT
from difftest.model.case import Case
from difftest.records.run_dir import RunDirectory

MAX_UNJUDGED = 4
"""With a launch pool, launches submitted (running, queued or finished) and not yet judged, per
executor, at most. Judging keeps their order, so a slow launch holds back the judging of those
after it, and while it runs the other executors go on only as far as this allows: at 2, on a
CPU, an executor whose two launches had ended sat idle behind another's slow one in one
launch in five (the workers waited 1.8-3.1 s of a 22 s run; at 4, 0.65-0.8 s). The price is
the lag of avoidance and quarantine: a group found, or a path's second loss, is acted on up
to this many launches per executor later."""


def explore_pooled(
    exploration: Exploration,
    launches: Iterator[list[tuple[int, Case]]],
    progress: Progress | None,
    stop_when: StopWhen | None,
) -> None:
    """Run launches until something stops it, with up to ``workers`` launches running at once
    (:class:`~difftest.execution.parallel.LaunchPool`) and a few queued behind each, judged in
    the order submitted. Launches are drawn and queued while the others run, so an executor whose
    launch ends starts the next without waiting for this loop; a launch is submitted before
    the one that ended is judged. Once the loop stops, the queued launches are dropped and
    those still running waited for (their write-ahead entries closed as cut)."""
    session = exploration.session
    pool = session.launch_pool(exploration.config.workers)
    start = time.monotonic()
    running: deque[_Running] = deque()
    started = exploration.tally.cases
    drawn: list[tuple[int, Case]] | None = None
    ended = False
    clean = False
    filler = exploration.filler
    try:
        while True:
            if drawn is None and not ended and exploration.no_further_launch(started) is None:
                drawn = next(launches, None)
                ended = drawn is None
            if drawn is not None and pool.has_room:
                if len(running) < MAX_UNJUDGED * pool.width:
                    extras = _extra_while_building(exploration, drawn, started)
                    for extra in extras:  # the planned launch would wait: extras instead
                        cases, token, check, _ = exploration.begin(extra, started, extra=True)
                        running.append(
                            _Running(token, session.start_launch(pool, cases, check), True)
                        )
                        started += len(cases)
                    if extras:
                        continue
                    cases, token, check, _ = exploration.begin(drawn, started)
                    running.append(_Running(token, session.start_launch(pool, cases, check)))
                    started += len(cases)
                    drawn = None
                    if filler is not None:
                        filler.met(cases[-1])
                    continue
            if not running:
                stop = exploration.no_further_launch(exploration.tally.cases)
                exploration.stop_reason = stop or "the case list ended"
                clean = True
                return
            token, future, is_extra = running[0]
            if not future.done():
                # wake when any launch ends: the queue has room for the drawn launch
                wait(
                    [r.future for r in running if not r.future.done()], return_when=FIRST_COMPLETED
                )
                continue
            running.popleft()
            try:
                ran = future.result()
            except BudgetSpent:
                exploration.out.end(token, "cut")
                exploration.stop_reason = BUDGET_SPENT
                clean = True
                return
            if is_extra:
                assert filler is not None  # only filling queues extra launches
                filler.filled += len(ran.judged)
            if exploration.accept(session.account_launch(ran), token, progress, stop_when, start):
                clean = True
                return
            stop = exploration.no_further_launch(exploration.tally.cases)
            if stop is not None and running:
                exploration.stop_reason = stop
                clean = True
                return
    finally:
        _drop(exploration.out, running, pool, wait=clean)


class _Running(NamedTuple):
    """A launch submitted to the pool and not yet judged."""

    token: int
    """Its write-ahead entry."""
    future: Future[Ran]
    extra: bool = False
    """Extra variations run while modules built (:class:`~difftest.campaign.filling.Filler`)."""


def _extra_while_building(
    exploration: Exploration, drawn: list[tuple[int, Case]], started: int
) -> list[list[tuple[int, Case]]]:
    """Launches of extra variations to queue instead of ``drawn`` (the next planned launch)
    while its modules build: with several workers a launch waits for all of them
    (:meth:`BuildWaits.compile_ahead`, not patient), and every worker would run dry behind it.
    Empty: ``drawn`` goes now (its modules are built, no filling, or no variant is built yet
    to draw extras of: it then waits as before)."""
    builds, filler = exploration.builds, exploration.filler
    if builds is None or filler is None or exploration.no_further_launch(started) is not None:
        return []
    cases = [case for _, case in drawn]
    builds.submit(cases)
    active = {p.name for p in exploration.session.active}
    needed = [k for k in builds.ahead.keys(cases) if k[0] in active]
    if not builds.ahead.still_building(needed):
        return []
    extra = filler.next_extra()
    if extra is None:
        return []
    # split as planned launches are: eight large cases may overfill one launch, or a worker
    size, limit = max(1, exploration.config.pack), exploration.max_pool_bytes
    return [
        [(-1, case) for case in part]
        for part in packing.group_for_launches(extra, size, max_pool_bytes=limit)
    ]


def _drop(
    out: RunDirectory,
    running: deque[_Running],
    pool: LaunchPool,
    *,
    wait: bool,
) -> None:
    """Launches submitted but not to be judged: the queued ones dropped, the running ones
    waited for (``wait``), each closed as cut in the write-ahead log; or, when the loop was
    abandoned (a second interrupt), the pool's workers are stopped and the launches left open
    there, as the sequential loop leaves the launch it abandons."""
    if not wait:
        pool.close()
        return
    for _, future, _ in running:
        pool.cancel(future)  # a queued launch is dropped before it starts
    for token, future, _ in running:
        if not future.cancelled():
            try:
                future.result()
            except Exception:  # a launch cut by the budget, or a worker that failed
                pass
        out.end(token, "cut")
    running.clear()
