"""Several launches running at once, each in its own executor, handed back in the order started.

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
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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


def run_launch(
    executor: Executor,
    cases: Sequence[Case],
    check_determinism: bool,
    only: Sequence[str],
) -> Ran:
    """``cases`` judged as one launch on ``executor`` (the paths ``only``)."""
    results: list[CaseResult] = []

    def run(launch: Sequence[Case], check: bool) -> list[CaseResult]:
        if len(launch) == 1:
            out = [executor.evaluate(launch[0], check_determinism=check, only=only)]
        else:
            out = executor.evaluate_pack(launch, check_determinism=check, only=only)
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
