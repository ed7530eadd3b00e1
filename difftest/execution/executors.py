"""Executors: where a case's paths run. In this process, or (see
:mod:`difftest.execution.isolation`) in a watched worker process that a crash or a hang cannot
take down with it. Only :class:`difftest.execution.session.Session` constructs them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from difftest.execution.evaluate import evaluate_pack
from difftest.judgement.tolerance import Tolerance
from difftest.machine.memory import never_fitted, out_of_memory, release_cached_memory
from difftest.model.case import Case
from difftest.model.outcome import CaseResult
from difftest.paths.registry import KernelPath


class BudgetSpent(Exception):
    """A run was cut off because the command's wall-clock budget ended (not a verdict: the
    case is left unjudged, and the caller stops)."""


class StoppedFromOutside(BudgetSpent):
    """A run was cut off because its isolated worker was killed by SIGINT, SIGTERM or SIGHUP
    from outside (``pkill -f difftest``, a job runner stopping the command's processes): no
    kernel fault sends these, so it is a stop, never a ``CRASH``. As with a spent budget the
    case is left unjudged and the caller stops; the executor has also recorded the stop in
    the command's :class:`~difftest.execution.interrupts.Interrupts`, so the command reports
    itself interrupted."""


class Executor(Protocol):
    """Runs cases through a fixed list of paths on a fixed device.

    ``only``: run just these of its paths (the others are left out of the result).
    ``stop_at``: a monotonic time no run may wait past (:class:`BudgetSpent` then)."""

    paths: Sequence[KernelPath]
    device: torch.device
    stop_at: float | None
    runs_elsewhere: bool
    """Its cases run in another process: a thread of this one can wait for a launch while
    this one does other work (:class:`~difftest.execution.parallel.BackgroundLaunch`)."""

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult: ...

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        """Each case's verdict, the cases (packable, :mod:`difftest.execution.packing`)
        sharing one launch per path."""
        ...

    def spawn_early(self) -> None:
        """Start what the first case will need without waiting for it (a worker process);
        a no-op where nothing needs starting."""
        ...

    def close(self) -> None: ...


def selected(paths: Sequence[KernelPath], only: Sequence[str] | None) -> list[KernelPath]:
    """``paths`` restricted to the names in ``only`` (all of them when ``None``)."""
    return list(paths) if only is None else [p for p in paths if p.name in set(only)]


class InProcessExecutor:
    """Runs paths in the calling process: fastest, but a crash or hang takes the caller down.
    (``stop_at`` is checked before a run; a run in this process cannot be cut short.)"""

    runs_elsewhere = False

    def __init__(
        self,
        paths: Sequence[KernelPath],
        device: torch.device,
        tolerance: Tolerance | None = None,
        *,
        skip_unfitting: bool = False,
    ) -> None:
        self.paths: Sequence[KernelPath] = list(paths)
        self.skip_unfitting = skip_unfitting
        """As an isolated worker's executor's: a case out of memory twice, alone, is
        ``UNSUPPORTED`` on every path, not :class:`~difftest.machine.memory.DeviceMemoryError`."""
        self.device = device
        self.tolerance = tolerance
        self.stop_at: float | None = None

    def _check_clock(self) -> None:
        import time

        if self.stop_at is not None and time.monotonic() >= self.stop_at:
            raise BudgetSpent("the budget ended before this run")

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        """``case``'s verdicts; out of memory, it runs once more after the allocator's cache
        is given back, and a second time is :class:`~difftest.machine.memory.DeviceMemoryError`
        or, with :attr:`skip_unfitting`, ``UNSUPPORTED`` on every path (as in an isolated
        worker)."""
        self._check_clock()
        for attempt in (1, 2):
            try:
                return self._judged([case], check_determinism, only)[0]
            except Exception as e:
                if not out_of_memory(e):
                    raise
                release_cached_memory(self.device)
                if attempt == 2:
                    names = [p.name for p in selected(self.paths, only)]
                    return never_fitted(
                        case.digest(), names, self.device, e, skip=self.skip_unfitting
                    )
        raise AssertionError("unreachable")

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        self._check_clock()
        try:
            return self._judged(cases, check_determinism, only)
        except Exception as e:
            if not out_of_memory(e):
                raise
            # the launch did not fit: its cases alone (a packed launch is a convenience, not
            # a verdict), as an isolated worker's launch is judged
            release_cached_memory(self.device)
            return [self.evaluate(c, check_determinism=check_determinism, only=only) for c in cases]

    def _judged(
        self, cases: Sequence[Case], check_determinism: bool, only: Sequence[str] | None
    ) -> list[CaseResult]:
        """``cases`` run as one launch in this process (one case: as it runs alone)."""
        return evaluate_pack(
            cases,
            selected(self.paths, only),
            self.device,
            tolerance=self.tolerance,
            check_determinism=check_determinism,
        )

    def spawn_early(self) -> None:
        """Nothing to start: the paths run in this process."""

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
