"""``IsolatedExecutor``: run each case's paths in a watched worker process.

A worker is started with the ``spawn`` context (never ``fork``: a CUDA context does not survive
it) and reused across cases. The parent sends the case as JSON and waits, with a deadline per
phase (:mod:`difftest.execution.isolation.deadline`), for the worker's messages: "starting path X"
before
each path, then the :class:`CaseResult`. When the worker dies while running path X, X is a
``CRASH`` (with the exit signal or code); when X's deadline passes, X is a ``HANG`` and the
worker is stopped (SIGTERM, then SIGKILL after a short grace). Either way the worker is replaced
and the case is rerun in the fresh one without X, so every other path's result is intact. A
sticky device error the worker reports itself (``CRASH`` from
:func:`difftest.execution.evaluate.evaluate`)
also poisons it: it is replaced and the paths not reached are rerun. After the first
replacement a spare worker is kept warming up, so the next crash costs no start-up wait.

A session with a budget also caps each warm path run at a share of it (:attr:`hang_cap`), so a
hanging path cannot eat the run. A path's first miss of its limit (deadline or cap) is not yet a
hang: the case is rerun once with 1.5 times the limit, and only a second miss makes it a
``HANG``; once a path has hung, later misses are hangs at once.

A thread that queues a launch behind the running one (a
:class:`~difftest.execution.parallel.LaunchPool`'s caller) may write its first message to the
worker at once (:meth:`IsolatedExecutor.send_ahead`): the worker answers messages in order, and
finds the next in its pipe as it answers one. Each message has a serial number, which the
worker's answer and progress record carry, so the parent watches only its own message.

Nothing here touches the campaign's files: the write-ahead repro the campaign wrote before
calling :meth:`IsolatedExecutor.evaluate` stays until the campaign removes it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import torch

from difftest.execution.executors import BudgetSpent, Executor, StoppedFromOutside, selected
from difftest.execution.interrupts import Interrupts, process_interrupts
from difftest.execution.isolation.deadline import Deadline, Variant
from difftest.execution.isolation.wire import case_message, case_result_from_json, numbered
from difftest.execution.isolation.worker import (
    WorkerError,
    WorkerProcess,
    WorkerSettings,
    exit_description,
    innermost_frame,
)
from difftest.execution.launches import Verdicts, launch_results, rerun_alone
from difftest.execution.packing import packed_case
from difftest.judgement.tolerance import Tolerance
from difftest.machine.memory import never_fitted
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Metrics, Outcome, PathResult
from difftest.paths.registry import KernelPath

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
"""Signals that kill a worker only when someone stops it (a terminal, ``kill``, ``pkill``, a
job runner): its death by one of them is a stop (:class:`StoppedFromOutside`), not a
``CRASH``. A fault kills with SIGSEGV, SIGBUS, SIGABRT or SIGFPE; the kernel's memory killer
and a watchdog with SIGKILL; those stay crashes."""


class RemoteError(RuntimeError):
    """:func:`difftest.execution.evaluate.evaluate` raised inside the worker (a difftest bug); the
    message carries the worker's traceback, :attr:`exception` the name of what it raised."""

    def __init__(self, message: str, exception: str = "", out_of_memory: bool = False) -> None:
        super().__init__(message)
        self.exception = exception
        self.out_of_memory = out_of_memory
        """The worker ran out of device (or host) memory (:func:`~difftest.machine.memory.
        out_of_memory`): no bug, a launch too large for the memory left to it."""


def _crashed(results: Sequence[CaseResult]) -> bool:
    """Whether the worker reported a ``CRASH`` (a sticky device error) in any of ``results``:
    it is poisoned, and is replaced."""
    return any(r.outcome is Outcome.CRASH for result in results for r in result.results)


@dataclass(frozen=True, slots=True)
class _Ahead:
    """A message written to ``worker`` behind the one it ran then
    (:meth:`IsolatedExecutor.send_ahead`), not yet taken by the launch it belongs to."""

    message: bytes
    """As :func:`case_message` built it (without its serial)."""
    serial: int
    worker: WorkerProcess


@dataclass(frozen=True, slots=True)
class _Finished:
    results: list[CaseResult]
    alone: list[CaseResult | None] | None = None
    """Each case's verdict alone, where the worker reran it (a pack sent by
    :meth:`IsolatedExecutor.judge_pack`)."""

    @property
    def result(self) -> CaseResult:
        return self.results[0]


@dataclass(frozen=True, slots=True)
class _Lost:
    """The worker died or was stopped. ``path``: the path it was running (``None``: before
    the first path started)."""

    path: str | None
    outcome: Outcome
    reason: str
    seconds: float
    metrics: Metrics
    capped: bool = False
    """A ``HANG`` cut by the hang cap before the path's own deadline."""


POLL_S = 0.25
"""How often the parent looks at a long case's progress (which path runs, since when)."""

AHEAD_MAX = 3
"""Messages :meth:`IsolatedExecutor.send_ahead` writes behind the running one, at most: enough
that a worker on a CPU, whose cases take a few milliseconds, still has work when its parent
pauses for some tens of them (drawing a batch of Hypothesis templates: 15-20 ms every ~250
cases, and some 100 ms once a run)."""

CONFIRM_FACTOR = 1.5
"""A path's first hang (its deadline or the hang cap passed) is rerun once with this many times
the limit before it counts as a ``HANG``: on a loaded machine a healthy path can miss a limit
once (a descheduled worker, a first call of an op), and that must not be a finding."""


class IsolatedExecutor:
    """Runs cases in a spawned, watched worker process (see the module docstring).

    ``plugins``: the ``--plugin`` specs the worker imports so it resolves the same path
    names (a path registered only in this process's own code cannot run isolated).
    ``deadline``: the watchdog's limits; ``None`` chooses by device type.
    ``spare``: keep a second worker starting once one has been replaced.
    ``threads``: the worker's torch threads (default: this process's).
    ``memory_share``: the share of the device's memory the worker's allocator may hold
    (default: all; :func:`~difftest.execution.isolation.early.pool_memory_share`).
    """

    runs_elsewhere = True
    """A thread of this process waits on the worker while the process does other work."""

    def __init__(
        self,
        paths: Sequence[KernelPath],
        device: torch.device | str,
        tolerance: Tolerance | None = None,
        *,
        plugins: Sequence[str] = (),
        deadline: Deadline | None = None,
        spare: bool = True,
        threads: int | None = None,
        memory_share: float | None = None,
        skip_unfitting: bool = False,
    ) -> None:
        self.paths: Sequence[KernelPath] = list(paths)
        self.skip_unfitting = skip_unfitting
        """A case that runs its worker out of memory twice, alone, is ``UNSUPPORTED`` on every
        path (:func:`~difftest.machine.memory.never_fitted`), not a
        :class:`~difftest.machine.memory.DeviceMemoryError` (a campaign's session asks it)."""
        self.threads = threads
        """The worker's torch intra-op threads (``None``: this process's count)."""
        self.memory_share = memory_share
        """The share of the device's memory the worker's allocator may hold (``None``: all)."""
        self.device = torch.device(device)
        self.tolerance = tolerance
        self.plugins = tuple(plugins)
        self.deadline = deadline or Deadline.for_device(self.device.type)
        self.spare = spare
        self.stop_at: float | None = None
        """A monotonic time no wait may pass: the command's budget (:class:`BudgetSpent`)."""
        self.interrupts: Interrupts | None = None
        """The command's stop requests (``None``: the process's): a worker killed from outside
        records one (:class:`StoppedFromOutside`); the session sets its own."""
        self.hang_cap: float | None = None
        """The most seconds one warm path run may take before it is a ``HANG``, whatever its
        deadline says (the session sets it to a share of the budget: a hanging path must not
        eat the run). A first run of a variant on a GPU (a JIT compile) is never capped."""
        self.replacements = 0
        """Workers replaced after a crash, hang or sticky device error."""
        self.confirmed_hangs: set[str] = set()
        """Paths with a confirmed hang: a later one is a ``HANG`` at once."""
        self.confirmations = 0
        """Reruns made to confirm a first hang (:data:`CONFIRM_FACTOR`)."""
        self._worker: WorkerProcess | None = None
        self._spare: WorkerProcess | None = None
        self._lock = threading.Lock()
        """Held to write to the worker, and to change which worker is current: another thread
        may write a message ahead (:meth:`send_ahead`) while the executor's own runs one."""
        self._serials = itertools.count(1)
        self._busy: WorkerProcess | None = None
        """The worker while a message of this executor's own is written and unanswered."""
        self._ahead: list[_Ahead] = []
        """Messages written behind the running one, in the order written."""
        self.taken_ahead = 0
        """Messages that ran as written ahead (:meth:`send_ahead`), not sent again."""
        self.messages = 0
        """Case and pack messages written to workers (those written ahead included)."""
        self._warm: set[tuple[str, Variant]] = set()
        self._closed = False

    # -- the Executor protocol ------------------------------------------------------------------

    def narrowed(self, paths: Sequence[KernelPath]) -> IsolatedExecutor:
        """An executor of the same kind for fewer paths (the shrinker runs only the finding's
        path); it starts its own worker, and shares what this one learnt about hangs (a path
        confirmed to hang at the cap is not confirmed again)."""
        narrow = IsolatedExecutor(
            paths,
            self.device,
            self.tolerance,
            plugins=self.plugins,
            deadline=self.deadline,
            spare=False,
            threads=self.threads,
            memory_share=self.memory_share,
            skip_unfitting=self.skip_unfitting,
        )
        narrow.hang_cap, narrow.stop_at = self.hang_cap, self.stop_at
        narrow.interrupts = self.interrupts
        narrow.confirmed_hangs = self.confirmed_hangs
        return narrow

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        """Every path's verdict on ``case`` (``only``: just these paths); a crash or hang is
        the verdict of the path that caused it, and the other paths are rerun in a fresh
        worker."""
        start = time.monotonic()
        names = self._names(only)
        lost: dict[str, PathResult] = {}
        failures_before_start = 0
        final: CaseResult | None = None
        confirming: set[str] = set()
        short_of_memory = 0
        while final is None:
            todo = [n for n in names if n not in lost]
            if not todo:
                break
            try:
                message = case_message([case], todo, check_determinism)
                attempt = self._attempt(message, case, check_determinism, confirming)
            except RemoteError as e:  # the worker reported it and waits for the next case
                if not e.out_of_memory:
                    raise
                short_of_memory += 1
                if short_of_memory < 2:
                    continue  # once more: the worker gave its cached memory back, others may
                unfitted = never_fitted(
                    case.digest(), names, self.device, e, skip=self.skip_unfitting
                )
                return self._with_isolation_time(unfitted, time.monotonic() - start)
            except WorkerError:
                raise
            except BaseException:  # interrupted mid-case: the worker's state is unknown
                self._discard()
                raise
            if isinstance(attempt, _Finished):
                crashed = next(
                    (r for r in attempt.result.results if r.outcome is Outcome.CRASH), None
                )
                if crashed is None or crashed.path == todo[-1]:
                    final = attempt.result  # (a crash of the last path left nothing unrun)
                if crashed is not None:
                    # a sticky device error: the worker reported it and is poisoned
                    self._replace()
                    lost[crashed.path] = crashed
                continue
            self._replace()
            if attempt.outcome is Outcome.HANG and attempt.path is not None:
                if not {attempt.path} & (self.confirmed_hangs | confirming):
                    confirming.add(attempt.path)  # once more, with longer
                    self.confirmations += 1
                    continue
                self.confirmed_hangs.add(attempt.path)
            if attempt.path is not None:
                lost[attempt.path] = PathResult(
                    path=attempt.path,
                    outcome=attempt.outcome,
                    reason=attempt.reason,
                    metrics=attempt.metrics,
                    seconds=attempt.seconds,
                )
                continue
            failures_before_start += 1
            if failures_before_start >= 2:
                raise WorkerError(
                    f"case {case.digest()}: {attempt.reason} before any path started, twice "
                    "(materialising the batch or the oracle failed in the worker)"
                )
        return self._merge(case, names, lost, final, time.monotonic() - start)

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        """Each case's verdict from one launch per path
        (:func:`difftest.execution.evaluate.evaluate_pack`)
        in the worker. When the worker dies, hangs or reports a crash, no verdict of the
        launch is kept: the worker is replaced and each case is evaluated alone, so a crash
        is blamed on the case and path that cause it. A launch that runs the worker out of
        memory is also evaluated case by case (a packed launch is a convenience, not a
        verdict)."""
        if len(cases) == 1:
            return [self.evaluate(cases[0], check_determinism=check_determinism, only=only)]
        start = time.monotonic()
        names = self._names(only)
        message = case_message(cases, names, check_determinism)
        try:
            attempt = self._attempt(message, packed_case(cases), check_determinism)
        except RemoteError as e:
            if not e.out_of_memory:
                raise
            # the launch did not fit the device: its cases alone, as after a crash (the
            # worker reported it and waits for the next case; its memory is free again)
            return [self.evaluate(c, check_determinism=check_determinism, only=only) for c in cases]
        except WorkerError:
            raise
        except BaseException:
            self._discard()
            raise
        if isinstance(attempt, _Finished) and not _crashed(attempt.results):
            share = (time.monotonic() - start) / len(cases)
            return [self._with_isolation_time(r, share) for r in attempt.results]
        self._replace()
        return [self.evaluate(c, check_determinism=check_determinism, only=only) for c in cases]

    def judge_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[Verdicts]:
        """:func:`~difftest.execution.launches.rerun_alone` of a launch of ``cases``, in one
        message: the worker runs the launch, then each case with a finding in it alone, and
        answers with both. (Sent as messages of their own, the reruns cost a round trip each,
        and a launch written ahead of them would be withdrawn.) When the worker dies, reports
        a crash in that message, it is not known whether the launch or a rerun did it: the
        worker is replaced (where it is lost or poisoned) and the launch is judged again the
        way the parent judges one, a message a launch or a rerun (:meth:`evaluate_pack`, then
        :meth:`evaluate`), so that every case gets the verdict it would have got had the
        reruns never been sent together. When it runs out of memory there, each case is
        judged alone, once (the launch sent again would not fit either). After a hang (not waited
        for twice) each case is judged alone, as :meth:`evaluate_pack` judges a launch that
        hung: a packed-only finding of a launch whose rerun hung is then not seen."""
        names = self._names(only)
        run = functools.partial(launch_results, self, only=names)
        if len(cases) == 1:
            return rerun_alone(run, cases, check_determinism)
        start = time.monotonic()
        message = case_message(cases, names, check_determinism, alone=True)
        try:
            attempt = self._attempt(message, packed_case(cases), check_determinism)
        except RemoteError as e:
            if not e.out_of_memory:
                raise
            # the launch or a rerun did not fit the worker's memory share (its allocator gave
            # its cache back and retried before it raised, so the launch sent again would not
            # fit either: Run 45 counted 82-136 such failures in a warm eight-worker run):
            # each case alone, once, as evaluate_pack judges a launch that did not fit
            return [
                (self.evaluate(c, check_determinism=check_determinism, only=only), None)
                for c in cases
            ]
        except WorkerError:
            raise
        except BaseException:
            self._discard()
            raise
        if isinstance(attempt, _Lost) and attempt.outcome is Outcome.HANG:
            # not waited for twice: each case alone (its verdict alone, as a rerun's would
            # be), as evaluate_pack does after a hang
            self._replace()
            return [(run([c], check_determinism)[0], None) for c in cases]
        alone = attempt.alone if isinstance(attempt, _Finished) else None
        if (
            not isinstance(attempt, _Finished)
            or alone is None
            or _crashed(attempt.results)
            or _crashed([a for a in alone if a is not None])
        ):
            self._replace()
            return rerun_alone(run, cases, check_determinism)
        rerun = sum(sum(a.timings.values()) for a in alone if a is not None)
        share = max(0.0, time.monotonic() - start - rerun) / len(cases)
        packed = [self._with_isolation_time(r, share) for r in attempt.results]
        return list(zip(packed, alone, strict=True))

    @staticmethod
    def _with_isolation_time(result: CaseResult, wall_s: float) -> CaseResult:
        timings = dict(result.timings)
        timings["isolation"] = max(0.0, wall_s - sum(timings.values()))
        return dataclasses.replace(result, timings=timings)

    def send_ahead(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> bool:
        """Write the first message of a launch of ``cases`` (what :meth:`evaluate` or
        :meth:`evaluate_pack` with the same arguments sends first) to the worker now, while it
        runs a message of this executor's: the worker finds it in its pipe when it answers
        that one (and those written ahead before it), with no wait for this process to hand it
        over. The one thread that may call this while another runs a case on the executor (a
        :class:`~difftest.execution.parallel.LaunchPool` queues launches behind the running
        one). ``True`` if written; ``False``, and nothing written, when the worker runs
        nothing of ours now or holds :data:`AHEAD_MAX` messages ahead already (the launch then
        sends it itself, after those).

        The launches' own calls, next and in the order written, take the messages written
        ahead instead of sending them again, and watch them as they watch any (a crash or hang
        in one is its own). The messages written ahead are withdrawn when any other message is
        sent to the worker first (a launch ahead of them that reruns a case, a launch that was
        cancelled): their answers are then ignored, and their launches, if they still run,
        send them again. A worker replaced after a crash or hang takes its messages with it."""
        message = case_message(cases, self._names(only), check_determinism, alone=True)
        with self._lock:
            worker = self._busy
            if self._closed or worker is None or worker is not self._worker:
                return False
            if len(self._ahead) >= AHEAD_MAX:
                return False
            try:
                serial = self._write(worker, message)
            except OSError:  # it died: the launch before this one finds out how
                return False
            self._ahead.append(_Ahead(message, serial, worker))
        return True

    @property
    def sending(self) -> bool:
        """Whether a message of this executor's own is written to its worker and unanswered
        (:meth:`send_ahead` writes only behind one)."""
        return self._busy is not None

    def close(self) -> None:
        """Stop the workers. A case still running in another thread (a
        :class:`~difftest.execution.parallel.LaunchPool`'s) then ends with a
        :class:`WorkerError`: a closed executor starts no worker. A worker that holds a
        message written ahead and never taken (its launch was cancelled) is stopped at once,
        not asked to finish: it would run a case nobody waits for."""
        with self._lock:
            self._closed = True
            untaken = bool(self._ahead)
            workers = (self._worker, self._spare)
            self._worker = self._spare = self._busy = None
            self._ahead = []
        for worker in workers:
            if worker is not None:
                worker.stop(self.deadline.grace_s, polite=not untaken)

    def __enter__(self) -> IsolatedExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker now and wait until it is ready (otherwise the first case does)."""
        self._ready_worker()

    def spawn_early(self) -> None:
        """Start the worker now without waiting for it: its start-up (imports, the device
        context) runs while this process does other work, and the first case waits only for
        what is left of it."""
        if not self._closed:
            self._take_worker()

    @property
    def worker_pid(self) -> int | None:
        """The current worker's process id (``None`` before the first case)."""
        return self._worker.pid if self._worker is not None else None

    def adopt(self, worker: WorkerProcess) -> bool:
        """Take ``worker``, started before this executor existed (:meth:`Session.__init__
        <difftest.execution.session.Session>` starts its workers before it asks which paths
        can run here), as this executor's own: only when the executor has none yet and the
        worker was started with the executor's plugins, device, tolerance and threads, for
        its paths or more (a case message names the paths it runs)."""
        given, mine = worker.started_for, self._settings()
        if self._closed or self._worker is not None or given is None:
            return False
        if dataclasses.replace(given, path_names=mine.path_names) != mine:
            return False
        if not set(mine.path_names) <= set(given.path_names):
            return False
        self._worker = worker
        return True

    def _settings(self) -> WorkerSettings:
        """What this executor's workers are started with (:attr:`WorkerProcess.started_for`)."""
        return WorkerSettings(
            plugins=tuple(self.plugins),
            path_names=tuple(p.name for p in self.paths),
            device=str(self.device),
            tolerance=self.tolerance.to_json() if self.tolerance else None,
            # the worker computes as this process would: torch's default of one thread per
            # core made a worker on a loaded 2-core machine 8-14x slower than its parent
            # running the same cases on one thread
            threads=self.threads or torch.get_num_threads(),
            memory_share=self.memory_share,
        )

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess(self._settings())

    def _ready_worker(self) -> WorkerProcess:
        if self._closed:
            raise WorkerError("the isolated executor is closed")
        worker = self._take_worker()
        limit = self.deadline.startup_s
        if self.stop_at is not None:
            limit = min(limit, max(0.0, self.stop_at - worker.started_at))
        try:
            worker.wait_ready(limit)
        except WorkerError:
            self._worker = None
            if self.stop_at is not None and time.monotonic() >= self.stop_at:
                raise BudgetSpent("the budget ended while a worker was starting") from None
            raise
        return worker

    def _take_worker(self) -> WorkerProcess:
        """The current worker, else the spare promoted, else a new one spawned (not waited
        for); after a replacement a fresh spare is spawned behind it."""
        if self._worker is None:
            if self._spare is not None:
                self._worker, self._spare = self._spare, None
            else:
                self._worker = self._spawn()
            if self.spare and self.replacements:
                self._spare = self._spawn()
        return self._worker

    def _replace(self) -> None:
        self._discard()
        self.replacements += 1

    def _discard(self) -> None:
        with self._lock:
            worker, self._worker, self._busy, self._ahead = self._worker, None, None, []
        if worker is not None:
            worker.stop(self.deadline.grace_s)

    def _deliver(self, message: bytes) -> tuple[WorkerProcess, int]:
        """A ready worker with ``message`` written to it, and the message's serial number: the
        first written ahead (:meth:`send_ahead`) when it is this message to this worker, else
        a new one (the messages written ahead are then withdrawn: the worker runs them first,
        and their answers are ignored)."""
        with self._lock:
            ahead = self._ahead[0] if self._ahead else None
            if ahead is not None and ahead.worker is self._worker and ahead.message == message:
                del self._ahead[0]
                self._busy = ahead.worker
                self.taken_ahead += 1
                return ahead.worker, ahead.serial
            self._ahead = []
        worker = self._ready_worker()
        with self._lock:
            serial = self._write(worker, message)
            self._busy = worker
        return worker, serial

    def _write(self, worker: WorkerProcess, message: bytes) -> int:
        """Write ``message`` to ``worker`` under a new serial number, and return it (the caller
        holds the lock)."""
        serial = next(self._serials)
        worker.send_bytes(numbered(message, serial))
        self.messages += 1
        return serial

    def _names(self, only: Sequence[str] | None) -> list[str]:
        """The names of the paths a call runs (``only``: those of them), in order: what its
        first message asks for."""
        return [p.name for p in selected(self.paths, only)]

    # -- one attempt at a case ------------------------------------------------------------------

    def _attempt(
        self,
        message: bytes,
        case: Case,
        check_determinism: bool,
        confirming: set[str] | frozenset[str] = frozenset(),
    ) -> _Finished | _Lost:
        """Send ``message`` (:func:`case_message`: one case, or a pack whose launch has the
        shape of ``case``), unless it was written ahead, and watch the worker until it
        answers, dies or passes a deadline set by ``case``."""
        worker, serial = self._deliver(message)
        try:
            return self._watch(worker, serial, case, check_determinism, confirming)
        finally:
            with self._lock:
                if self._busy is worker:
                    self._busy = None

    def _watch(
        self,
        worker: WorkerProcess,
        serial: int,
        case: Case,
        check_determinism: bool,
        confirming: set[str] | frozenset[str],
    ) -> _Finished | _Lost:
        """:meth:`_attempt`'s watch over message ``serial``: the worker's progress record
        counts only while it names this message (the worker may still be finishing a message
        withdrawn before it), and an answer to another message is skipped."""
        variant = case.compile_variant()
        current: str | None = None
        limit = self.deadline.for_setup(case)
        capped = False
        phase_start = time.monotonic()
        while True:
            # the worker's progress since the last look: a path that started is warm, and the
            # running one has its own limit, from its own start
            look = worker.progress.read_for(serial)
            if look.running is not None and (look.running != current or look.since != phase_start):
                # a path started (the same one again too: a rerun alone in the same message)
                current = look.running
                cold = (current, variant) not in self._warm
                own = self.deadline.for_path(case, cold=cold, check_determinism=check_determinism)
                compiling = cold and self.device.type == "cuda"
                cap = self.hang_cap
                if current in confirming:
                    own *= CONFIRM_FACTOR
                    cap = None if cap is None else cap * CONFIRM_FACTOR
                limit = own if compiling or cap is None else min(own, cap)
                capped = limit < own
                phase_start = look.since
            self._warm.update((name, variant) for name in look.started)
            wait = limit - (time.monotonic() - phase_start)
            cut = self.stop_at is not None and self.stop_at - time.monotonic() < wait
            if cut:
                assert self.stop_at is not None
                wait = self.stop_at - time.monotonic()
            try:
                # a look at the progress a few times a second: a hang is told within POLL_S
                # of its path's own limit
                answer = worker.receive(min(wait, POLL_S))
            except EOFError:
                look = worker.progress.read_for(serial)
                if look.running not in (None, current):
                    current, phase_start = look.running, look.since
                seconds = time.monotonic() - phase_start
                code = worker.exitcode()
                if code is not None and -code in STOP_SIGNALS:
                    self._stopped_from_outside(signal.Signals(-code).name, current)
                return _Lost(
                    path=current,
                    outcome=Outcome.CRASH,
                    reason=exit_description(code) + (" while running this path" if current else ""),
                    seconds=seconds,
                    metrics=Metrics(exitcode=code, worker_output=tuple(worker.log_tail())),
                )
            if answer is None and (
                wait > POLL_S or worker.progress.read_for(serial).running != current
            ):
                continue  # only a look, or the next path started as the limit passed
            if answer is None and cut:
                self._discard()  # not a hang: the command's budget ended first
                raise BudgetSpent(f"the budget ended while {current or 'a case'} was running")
            if answer is None:
                seconds = time.monotonic() - phase_start
                what = f"path {current}" if current else "the worker"
                worker.dump_stacks()  # where it is stuck, into its log, before it is stopped
                tail = worker.log_tail()
                where = innermost_frame(tail)
                return _Lost(
                    path=current,
                    outcome=Outcome.HANG,
                    reason=f"{what} gave no result within "
                    + (
                        f"the run's {limit:.1f}s hang cap (a share of the budget)"
                        if capped
                        else f"its {limit:.1f}s deadline"
                    )
                    + "; worker stopped"
                    + (f"; it was in {where}" if where else ""),
                    seconds=seconds,
                    metrics=Metrics(deadline_s=round(limit, 3), worker_output=tuple(tail)),
                    capped=capped,
                )
            if answer.get("serial") != serial:
                continue  # the answer to a message withdrawn before ours (see send_ahead)
            kind = answer["type"]
            if kind in ("result", "results"):
                self._warm.update((name, variant) for name in answer.get("started", ()))
            if kind == "result":
                return _Finished([case_result_from_json(answer["result"])])
            elif kind == "results":
                alone = answer.get("alone")
                return _Finished(
                    [case_result_from_json(r) for r in answer["results"]],
                    None
                    if alone is None
                    else [case_result_from_json(r) if r is not None else None for r in alone],
                )
            elif kind == "error":
                if answer.get("usage"):
                    raise WorkerError(str(answer["message"]).strip().splitlines()[0])
                raise RemoteError(
                    f"difftest failed inside the isolated worker on case {case.digest()}:\n"
                    f"{answer['traceback']}",
                    exception=str(answer.get("exception", "")),
                    out_of_memory=bool(answer.get("out_of_memory")),
                )
            else:  # not RemoteError: the caller discards a worker that talks nonsense
                raise RuntimeError(f"unexpected message from the isolated worker: {kind!r}")

    def _stopped_from_outside(self, name: str, running: str | None) -> NoReturn:
        """The worker died of ``name``, one of :data:`STOP_SIGNALS`: record the stop and cut
        the run (no verdict; the dead worker is let go, a later run starts another)."""
        (self.interrupts or process_interrupts()).request(f"{name} to an isolated worker")
        self._discard()
        raise StoppedFromOutside(
            f"the isolated worker was stopped by {name} from outside"
            + (f" while {running} ran" if running else "")
        )

    @staticmethod
    def _merge(
        case: Case,
        names: list[str],
        lost: dict[str, PathResult],
        final: CaseResult | None,
        wall_s: float,
    ) -> CaseResult:
        """The final run's results and pairs with the lost paths' verdicts put back in order.
        ``timings["isolation"]``: the wall time not spent in the final run (start-up waits,
        runs cut short by a crash or hang, the watchdog)."""
        results = []
        for name in names:
            result = lost.get(name) or (final.result_for(name) if final else None)
            if result is None:  # cannot happen: the final run covered every path not lost
                raise RemoteError(f"the worker returned no result for path {name!r}")
            results.append(result)
        timings = dict(final.timings) if final else {}
        timings["isolation"] = max(0.0, wall_s - sum(timings.values()))
        return CaseResult(
            case_digest=case.digest(),
            results=tuple(results),
            pairs=final.pairs if final else (),
            timings=timings,
        )


if TYPE_CHECKING:

    def _implements_the_protocol(executor: IsolatedExecutor) -> Executor:
        return executor
