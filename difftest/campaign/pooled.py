"""The exploration loop of several launches at once (``CampaignConfig.workers`` > 1): up to
``workers`` launches run on a :class:`~difftest.execution.parallel.LaunchPool`, with a few
queued behind each (:data:`~difftest.execution.parallel.LANE_DEPTH`), judged in the order
started.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait

from difftest.campaign.exploration import Exploration, Progress, StopWhen
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
    running: deque[tuple[int, Future[Ran]]] = deque()
    started = exploration.tally.cases
    drawn: list[tuple[int, Case]] | None = None
    ended = False
    clean = False
    try:
        while True:
            if drawn is None and not ended and exploration.no_further_launch(started) is None:
                drawn = next(launches, None)
                ended = drawn is None
            if drawn is not None and pool.has_room:
                if len(running) < MAX_UNJUDGED * pool.width:
                    cases, token, check, _ = exploration.begin(drawn, started)
                    running.append((token, session.start_launch(pool, cases, check)))
                    started += len(cases)
                    drawn = None
                    continue
            if not running:
                stop = exploration.no_further_launch(exploration.tally.cases)
                exploration.stop_reason = stop or "the case list ended"
                clean = True
                return
            token, future = running[0]
            if not future.done():
                # wake when any launch ends: the queue has room for the drawn launch
                wait([f for _, f in running if not f.done()], return_when=FIRST_COMPLETED)
                continue
            running.popleft()
            try:
                ran = future.result()
            except BudgetSpent:
                exploration.out.end(token, "cut")
                exploration.stop_reason = BUDGET_SPENT
                clean = True
                return
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


def _drop(
    out: RunDirectory,
    running: deque[tuple[int, Future[Ran]]],
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
    for _, future in running:
        pool.cancel(future)  # a queued launch is dropped before it starts
    for token, future in running:
        if not future.cancelled():
            try:
                future.result()
            except Exception:  # a launch cut by the budget, or a worker that failed
                pass
        out.end(token, "cut")
    running.clear()
