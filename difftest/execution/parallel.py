"""Launches that run while the parent goes on: several at once, each in its own executor
(:class:`LaunchPool`), or one at a time in the background of a sequential campaign
(:class:`BackgroundLaunch`); either way handed back in the order started.

One isolated worker computes while its parent draws, plans and records, so on a machine with two
cores or more a sequential campaign leaves cores idle. :class:`LaunchPool` keeps up to
``width`` launches running, each on an executor of its own (an isolated executor: its own
worker process), each driven by a thread of the parent (a thread waiting on a worker's pipe
does not hold the GIL, so the parent keeps drawing meanwhile). A few more launches may wait
behind each running one (:data:`LANE_DEPTH`), and a launch that waits so is written to its
worker's pipe at once (``send_ahead``; an isolated worker reruns a launch's cases alone
itself, so a launch is one message): the worker starts it as soon as it
answers the one before, with no wait for its parent to receive that answer, judge it or hand
the next one over. On a CPU, where a launch is one case of a few milliseconds, that wait was a
seventh of the wall time when each launch was sent after the last answer, and still a tenth
when the thread whose launch ended sent the next one (a thread of the parent first has to get
the interpreter back from the one that draws); with one launch written ahead, the parent's
pauses (a batch of Hypothesis templates drawn every ~250 cases, 15-20 ms) still left the
workers idle, hence several.

A launch runs exactly as the sequential campaign runs it: :func:`judge_launch` on one executor
(the packed launch, then any case not AGREE alone). What it does not do in its thread is the
session's bookkeeping (crash counts, quarantine): :class:`Ran` keeps every verdict in the order
``judge_launch`` asked for them, and the caller accounts for them in launch order
(:meth:`difftest.execution.session.Session.account_launch`).

A sequential campaign has one executor (one worker: on a GPU, one device context), and its
parent still has work between launches: accounting for a launch's verdicts, triaging and
recording its findings, drawing and planning the next one. :class:`BackgroundLaunch` runs the
next launch on that executor in a thread while the parent does that work for the one before;
anything else that needs the executor (a recheck, a shrink) first waits for the launch to end
(:meth:`BackgroundLaunch.drain`), so the executor never runs two things at once. An executor
that runs its cases in this process gains nothing from a thread (the launch and the parent's
work would take turns at the interpreter): its launch runs at once, in the same order, so the
campaign's case list and verdicts do not depend on where its cases ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from difftest.execution.executors import BudgetSpent, Executor
from difftest.execution.launches import Judged, judge_launch, judged_from, launch_results
from difftest.model.case import Case
from difftest.model.outcome import CaseResult


@dataclass(frozen=True, slots=True)
class Ran:
    """One launch's verdicts, not yet accounted for by the session."""

    judged: list[Judged]
    results: list[CaseResult]
    """Every verdict the launch produced, in the order :func:`judge_launch` asked for them (the
    packed launch's, then each rerun alone); the ``result`` of each :attr:`judged` is one of
    these objects."""


def one_message(executor: Executor, cases: int) -> bool:
    """Whether :func:`run_launch` sends a launch of ``cases`` cases to ``executor``'s worker
    as one message, reruns included (a crash or a hang aside), so that a launch may be
    written to the worker behind it: a launch of one case, or any launch where the worker
    reruns cases alone itself (``judge_pack``)."""
    return cases == 1 or hasattr(executor, "judge_pack")


def run_launch(
    executor: Executor,
    cases: Sequence[Case],
    check_determinism: bool,
    only: Sequence[str],
) -> Ran:
    """``cases`` judged as one launch on ``executor`` (the paths ``only``): in one message
    to its worker, reruns alone included, where the executor can
    (:meth:`~difftest.execution.isolation.isolated.IsolatedExecutor.judge_pack`)."""
    judge_pack = getattr(executor, "judge_pack", None)
    if judge_pack is not None and len(cases) > 1 and only:
        verdicts = judge_pack(cases, check_determinism=check_determinism, only=only)
        ran = [packed for packed, _ in verdicts] + [a for _, a in verdicts if a is not None]
        return Ran(judged=judged_from(cases, verdicts), results=ran)
    results: list[CaseResult] = []

    def run(launch: Sequence[Case], check: bool) -> list[CaseResult]:
        out = launch_results(executor, launch, check, only)
        results.extend(out)
        return out

    judged = judge_launch(run, cases, check_determinism=check_determinism)
    return Ran(judged=judged, results=results)


@dataclass(eq=False)
class _Queued:
    """A launch given to a lane of the pool, and whether its lane has started it."""

    cases: list[Case]
    started: bool = False
    written: bool = False
    """Its first message was written to the executor's worker ahead of its start."""
    future: Future[Ran] | None = None


LANE_DEPTH = 4
"""Launches a lane of a :class:`LaunchPool` holds: the one running and those queued behind it
(:data:`~difftest.execution.isolation.isolated.AHEAD_MAX` of them can be written ahead)."""


class LaunchPool:
    """Up to ``len(executors)`` launches at once, one executor each, and up to
    ``LANE_DEPTH - 1`` more queued behind each (see the module docstring).

    Each executor is a lane: a thread that runs the lane's launches in the order given. A
    launch goes to the lane with the fewest unfinished (the first such), and when it queues
    behind a running launch of one message (and behind launches written ahead, if any), its
    first message is written to that executor's worker at once (``send_ahead``, where the
    executor has it), so the worker starts it without waiting for this process. (A launch of
    several cases whose reruns alone the parent sends itself, as messages of their own, would
    withdraw a message written ahead of them: nothing is written behind it; see
    :func:`one_message`.)

    The pool owns its executors: :meth:`close` closes them, which also ends the launches still
    running (their futures then raise) and drops the queued ones (their futures are
    cancelled)."""

    def __init__(self, executors: Sequence[Executor]) -> None:
        if not executors:
            raise ValueError("a launch pool needs at least one executor")
        self.executors = list(executors)
        self._lanes = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"difftest-launch-{i}")
            for i in range(len(self.executors))
        ]
        self._queues: list[list[_Queued]] = [[] for _ in self.executors]
        """Each lane's unfinished launches, in order: the first runs (or is about to)."""
        self._lock = threading.Lock()

    @property
    def width(self) -> int:
        """Launches that may run at once."""
        return len(self.executors)

    @property
    def running(self) -> int:
        """Launches running now (on an executor): the lanes whose first has started."""
        return sum(1 for queue in self._queues if queue and queue[0].started)

    @property
    def unfinished(self) -> int:
        """Launches submitted and not yet finished: running, or queued."""
        return sum(len(q) for q in self._queues)

    @property
    def has_room(self) -> bool:
        """Whether :meth:`submit` takes another launch (:data:`LANE_DEPTH` per lane)."""
        return self.unfinished < LANE_DEPTH * self.width

    def submit(
        self, cases: Sequence[Case], check_determinism: bool, only: Sequence[str]
    ) -> Future[Ran]:
        """Queue ``cases`` as one launch on the lane with the fewest unfinished; it starts at
        once if the lane is idle. At most :data:`LANE_DEPTH` launches per lane may be
        unfinished (:attr:`has_room`): a launch is finished once its future is done."""
        launch = _Queued(list(cases))
        with self._lock:
            lane = min(range(self.width), key=lambda i: len(self._queues[i]))
            queue = self._queues[lane]
            if len(queue) >= LANE_DEPTH:
                raise RuntimeError(
                    f"all {self.width} executors of the pool are busy and "
                    f"{(LANE_DEPTH - 1) * self.width} launches wait"
                )
            queue.append(launch)
            try:
                future = self._lanes[lane].submit(self._run, lane, launch, check_determinism, only)
            except BaseException:
                queue.remove(launch)
                raise
            launch.future = future
            before = queue[:-1]
            executor = self.executors[lane]
            if (
                before
                and only
                and before[0].started
                and all(b.written for b in before[1:])
                and all(one_message(executor, len(b.cases)) for b in before)
            ):
                # behind launches of one message each, the first started, the others written
                # ahead: written to its worker now, after them (under the lock: the lane
                # cannot start it meanwhile and send it again)
                send_ahead = getattr(executor, "send_ahead", None)
                if send_ahead is not None:
                    launch.written = send_ahead(
                        launch.cases, check_determinism=check_determinism, only=only
                    )
        return future

    def _run(self, lane: int, launch: _Queued, check_determinism: bool, only: Sequence[str]) -> Ran:
        executor = self.executors[lane]
        with self._lock:
            launch.started = True
        try:
            if executor.stop_at is not None and time.monotonic() >= executor.stop_at:
                # queued past the budget: not sent (a worker cut mid-case is stopped)
                raise BudgetSpent("the budget ended before the launch started")
            return run_launch(executor, launch.cases, check_determinism, only)
        finally:
            with self._lock:
                self._queues[lane].remove(launch)

    def cancel(self, future: Future[Ran]) -> bool:
        """Drop a queued launch before it starts: ``True`` when it had not started (its
        future is then cancelled), ``False`` when it is running or done. (A message of it
        written ahead is withdrawn by the next one the executor sends.)"""
        with self._lock:
            for queue in self._queues:
                for launch in queue:
                    if launch.future is future and not launch.started and future.cancel():
                        queue.remove(launch)
                        return True
        return False

    def close(self) -> None:
        """Drop the queued launches, close every executor (a launch still running in one
        ends with an error), then let the threads go."""
        for lane in self._lanes:
            lane.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for queue in self._queues:
                queue[:] = [launch for launch in queue if launch.started]
        for executor in self.executors:
            executor.close()


DELIVERY_WAIT_S = 1.0
"""How long :meth:`BackgroundLaunch.write_ahead` waits for the running launch's thread to write
its own message (normally a few milliseconds; longer only while its worker starts)."""

DELIVERY_POLL_S = 0.0005
"""How often it looks meanwhile."""


class BackgroundLaunch:
    """At most one launch at a time on a given executor, run in a thread of this process when
    the executor's cases run elsewhere (``runs_elsewhere``: a worker process), else at once
    (see the module docstring)."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._running: tuple[Future[Ran], Executor, int] | None = None
        """The launch running: its future, its executor and how many cases it holds."""
        self.in_background = False
        """Whether the last launch started here ran in the thread (else at once)."""

    def start(
        self,
        executor: Executor,
        cases: Sequence[Case],
        check_determinism: bool,
        only: Sequence[str],
    ) -> Future[Ran]:
        """``cases`` judged as one launch on ``executor`` (:func:`run_launch`), after the
        launch before it has ended. Its errors (a budget that ended, a worker that failed)
        are the future's, raised where its result is asked for."""
        self.drain()
        self.in_background = bool(getattr(executor, "runs_elsewhere", False))
        if not self.in_background:
            done: Future[Ran] = Future()
            try:
                done.set_result(run_launch(executor, cases, check_determinism, only))
            except Exception as e:  # not KeyboardInterrupt: a second signal abandons it here
                done.set_exception(e)
            return done
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="difftest-launch")
        future = self._thread.submit(run_launch, executor, list(cases), check_determinism, only)
        self._running = (future, executor, len(cases))
        return future

    def write_ahead(
        self,
        executor: Executor,
        cases: Sequence[Case],
        check_determinism: bool,
        only: Sequence[str],
    ) -> bool:
        """Write the first message of the launch :meth:`start` will be given next (the same
        arguments) to ``executor``'s worker now, behind the launch running there, so that the
        worker starts it as soon as it answers that one, with no wait for this process to
        account for it and hand the next one over. Only behind a launch of one message
        (:func:`one_message`) on the same executor, and only where the executor can
        (``send_ahead``); ``True`` if written. Should the next launch not be started (the run
        stopped), the worker's answer to the message is ignored."""
        running = self._running
        if running is None or running[1] is not executor or running[0].done() or not only:
            return False
        send_ahead = getattr(executor, "send_ahead", None)
        if send_ahead is None or not one_message(executor, running[2]):
            return False
        # the launch's thread may not have written its own message yet (this process draws
        # the next launch faster than that thread gets the interpreter back): wait for it,
        # as this process would wait for the launch itself next
        give_up = time.monotonic() + DELIVERY_WAIT_S
        while not getattr(executor, "sending", True) and not running[0].done():
            if time.monotonic() >= give_up:
                return False
            time.sleep(DELIVERY_POLL_S)
        return bool(send_ahead(cases, check_determinism=check_determinism, only=only))

    def drain(self) -> None:
        """Wait until the launch running (if any) has ended: its executor is free again. Its
        result stays with its future."""
        if self._running is not None:
            wait([self._running[0]])
            self._running = None

    def abandon(self) -> Executor | None:
        """Close the executor of a launch still running (its future then ends with an
        error, not waited for here) and return it; ``None`` when none is running."""
        running, self._running = self._running, None
        if running is None or running[0].done():
            return None
        running[1].close()
        return running[1]

    def close(self) -> None:
        """Let the thread go (a launch still running ends when its executor closes)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None
