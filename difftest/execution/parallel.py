"""Launches that run while the parent goes on: several at once, each in its own executor
(:class:`LaunchPool`), or one at a time in the background of a sequential campaign
(:class:`BackgroundLaunch`); either way handed back in the order started.

One isolated worker computes while its parent draws, plans and records, so on a machine with two
cores or more a sequential campaign leaves cores idle. :class:`LaunchPool` keeps up to
``width`` launches running, each on an executor of its own (an isolated executor: its own
worker process), each driven by a thread of the parent (a thread waiting on a worker's pipe
does not hold the GIL, so the parent keeps drawing meanwhile).

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
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from difftest.execution.executors import Executor
from difftest.execution.launches import Judged, judge_launch
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


def run_launch(
    executor: Executor,
    cases: Sequence[Case],
    check_determinism: bool,
    only: Sequence[str],
) -> Ran:
    """``cases`` judged as one launch on ``executor`` (the paths ``only``)."""
    results: list[CaseResult] = []

    def run(launch: Sequence[Case], check: bool) -> list[CaseResult]:
        out = launch_results(executor, launch, check, only)
        results.extend(out)
        return out

    judged = judge_launch(run, cases, check_determinism=check_determinism)
    return Ran(judged=judged, results=results)


class LaunchPool:
    """Up to ``len(executors)`` launches at once, one executor each (see the module docstring).

    The pool owns its executors: :meth:`close` closes them, which also ends the launches still
    running (their futures then raise)."""

    def __init__(self, executors: Sequence[Executor]) -> None:
        if not executors:
            raise ValueError("a launch pool needs at least one executor")
        self.executors = list(executors)
        self._free = list(self.executors)
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(
            max_workers=len(self.executors), thread_name_prefix="difftest-launch"
        )
        self._running = 0

    @property
    def width(self) -> int:
        """Launches that may run at once."""
        return len(self.executors)

    @property
    def running(self) -> int:
        """Launches started and not yet finished."""
        return self._running

    def submit(
        self, cases: Sequence[Case], check_determinism: bool, only: Sequence[str]
    ) -> Future[Ran]:
        """Start ``cases`` as one launch on a free executor. At most :attr:`width` launches
        may be unfinished: a launch is finished once its future is done."""
        with self._lock:
            if not self._free:
                raise RuntimeError(f"all {self.width} executors of the pool are busy")
            executor = self._free.pop()
            self._running += 1
        return self._threads.submit(self._run, executor, list(cases), check_determinism, only)

    def _run(
        self,
        executor: Executor,
        cases: list[Case],
        check_determinism: bool,
        only: Sequence[str],
    ) -> Ran:
        try:
            return run_launch(executor, cases, check_determinism, only)
        finally:
            with self._lock:
                self._free.append(executor)
                self._running -= 1

    def close(self) -> None:
        """Close every executor (a launch still running in one ends with an error), then let
        the threads go."""
        for executor in self.executors:
            executor.close()
        self._threads.shutdown(wait=False, cancel_futures=True)


class BackgroundLaunch:
    """At most one launch at a time on a given executor, run in a thread of this process when
    the executor's cases run elsewhere (``runs_elsewhere``: a worker process), else at once
    (see the module docstring)."""

    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None
        self._running: tuple[Future[Ran], Executor] | None = None
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
        self._running = (future, executor)
        return future

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
