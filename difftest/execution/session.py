"""The run session: one per command, owning everything a run of kernels must agree on.

Every command that runs a kernel (``run``, ``bench``, the gate, the pytest plugin, ``replay``,
``shrink``, ``explain``'s rerun, ``export``'s check, the self-test, the corpus replay) opens a
:class:`Session` and asks it for its executor. The session answers, once, the questions each
caller used to answer on its own:

- **which device** (:func:`difftest.machine.device.pick_device`) and **which paths** (resolved
  by name, with the reason each one that cannot run here is unavailable);
- **isolated or not**: kernels run in a watched worker process by default, so a crash or a
  hang is a verdict and never takes the command down; ``isolation="none"`` runs them here;
- **what deadline**: the watchdog's :class:`~difftest.execution.isolation.Deadline`;
- **what budget**: one wall clock for everything the command does (:class:`Budget`); shrink
  time is a documented share of it, never added after it, and no launch waits past its end;
- **what a signal means** (:mod:`difftest.execution.interrupts`): the first asks the run to
  stop after the launch in flight, the second abandons that launch;
- **which paths are healthy**: a path that crashes or hangs :attr:`Settings.quarantine_after`
  times is quarantined for the rest of the run (its findings are kept; its later cases are
  skipped with that reason), so the other paths keep running at full rate; the health checks
  of :mod:`difftest.execution.health` read the session's counters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from difftest.execution.executors import BudgetSpent, Executor, InProcessExecutor
from difftest.execution.interrupts import Interrupts, process_interrupts
from difftest.execution.isolation.deadline import Deadline
from difftest.execution.launches import Judged, judge_launch, judged_from, launch_results
from difftest.execution.packing import group_for_launches
from difftest.execution.parallel import BackgroundLaunch, LaunchPool, Ran
from difftest.judgement.signature import Signature, signature_of
from difftest.judgement.tolerance import Tolerance
from difftest.machine.device import limit_memory, pick_device
from difftest.model.case import Case
from difftest.model.errors import SetupError
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths.registry import KernelPath, load_plugin, resolve

if TYPE_CHECKING:
    from difftest.execution.isolation.early import EarlyWorkers

Isolation = Literal["process", "none"]

SHRINK_SHARE = 0.25
"""The share of a wall-clock budget kept for shrinking while findings wait to be shrunk: the
campaign stops drawing new cases at ``(1 - SHRINK_SHARE) * budget`` when there is shrinking
left to do (and runs to the end of the budget otherwise)."""
QUARANTINE_AFTER = 2
"""Crashes or hangs of one path after which it is quarantined for the rest of the run."""
HANG_SHARE = 0.05
"""With a budget, a warm path run taking longer than this share of it is cut (and, after the
isolated executor's one confirming rerun, a ``HANG``): with quarantine after two losses a
hanging path costs about a sixth of the budget."""
HANG_FLOOR_S = 10.0
"""... but never less than this many seconds: on a machine busy with other work (CI runs tests
on two workers, each with its own isolated worker and a spare warming up) a healthy CPU path
was seen to stall for several seconds on a case it normally runs in 0.1 s."""

BUDGET_SPENT = "the budget is spent"
"""The stop reason of a run whose budget ran out (what its health check and report read)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What a command asks of its session (each command maps its options onto these)."""

    device: str | None = None
    """``None``: cuda when a GPU is visible, else cpu."""
    paths: tuple[str, ...] | None = None
    """Path names; ``None``: every registered path but the self-test's mutants."""
    plugins: tuple[str, ...] = ()
    """Modules or ``.py`` files registering paths, from the command line only (a repro's
    recorded plugins are data and are never imported)."""
    isolation: Isolation = "process"
    deadline: Deadline | None = None
    """``None``: the device type's defaults."""
    deadline_s: float | None = None
    """The deadline's base seconds (``--deadline-s``), over the defaults or ``deadline``."""
    budget_s: float | None = None
    """Wall-clock budget of the whole command; ``None``: no clock bound."""
    shrink_share: float = SHRINK_SHARE
    quarantine_after: int = QUARANTINE_AFTER
    tolerance: Tolerance = field(default_factory=Tolerance)
    require_paths: bool = False
    """A named path that cannot run here is a setup error (the gate: a pass must not hide
    an unavailable kernel)."""
    memory_share: float | None = None
    """The share of a GPU's memory this session's workers may hold together (``None``: the
    whole device): several sessions sharing one GPU (pytest-xdist workers pinned to it) each
    get a share, as the workers of one launch pool do."""
    skip_unfitting: bool = False
    """A case that runs out of memory twice, alone, is ``UNSUPPORTED`` on every path and the
    session goes on (a campaign: it drew the case itself, and its report counts them among
    the skips), not a :class:`~difftest.machine.memory.DeviceMemoryError` (a replay, a
    shrink, the gate: a case someone asked for)."""
    prestart: int = 0
    """With process isolation, the workers to start as the session opens, before it asks
    which paths can run here (the command's launch workers: 1, or its ``--workers``): their
    start-up (imports, the device context) then overlaps the session's own, where it was the
    first launch's wait (on an H200, a worker took ~9 s to start: as long as 200 cases)."""

    def __post_init__(self) -> None:
        if self.budget_s is not None and not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise SetupError(f"a budget of {self.budget_s} s: it must be a number > 0")
        if not 0 <= self.shrink_share < 1:
            raise SetupError(f"shrink share {self.shrink_share}: it must be in [0, 1)")
        if self.quarantine_after < 1:
            raise SetupError(f"quarantine after {self.quarantine_after}: it must be >= 1")
        if self.prestart < 0:
            raise SetupError(f"prestart {self.prestart}: it must be >= 0")
        if self.memory_share is not None and not 0 < self.memory_share <= 1:
            raise SetupError(f"memory share {self.memory_share}: it must be in (0, 1]")


@dataclass(slots=True)
class Budget:
    """The command's wall clock: everything it does is inside ``total_s`` (``None``: no
    bound). ``now`` is injectable so tests never depend on real time."""

    total_s: float | None
    shrink_share: float = SHRINK_SHARE
    now: Callable[[], float] = time.monotonic
    start: float = 0.0

    def __post_init__(self) -> None:
        self.start = self.now()

    def elapsed(self) -> float:
        return self.now() - self.start

    def remaining(self) -> float:
        return math.inf if self.total_s is None else self.total_s - self.elapsed()

    def spent(self) -> bool:
        return self.remaining() <= 0

    def stop_at(self) -> float | None:
        """The monotonic time no launch may wait past (``None``: unbounded)."""
        return None if self.total_s is None else self.start + self.total_s

    def exploring(self, shrinking_pending: bool) -> bool:
        """Whether a campaign may start another launch: before the end of the budget, and
        before the shrink share when findings wait to be shrunk."""
        if self.total_s is None:
            return True
        limit = self.total_s * (1 - self.shrink_share) if shrinking_pending else self.total_s
        return self.elapsed() < limit


@dataclass(frozen=True, slots=True, kw_only=True)
class Quarantine:
    """A path taken out of the run: why, and after how many cases it had run."""

    path: str
    reason: str
    after_cases: int


@dataclass(slots=True)
class PathCounters:
    """What the session saw of one path (the health checks read these)."""

    ran: int = 0
    skipped: int = 0
    lost: int = 0
    """Crashes and hangs."""
    skip_reasons: Counter[str] = field(default_factory=Counter)
    skip_seconds: float = 0.0
    """Wall time of cases this path skipped (what its skipping cost the budget)."""


def _executor_key(paths: Sequence[KernelPath]) -> tuple[str, ...]:
    """The key of the session's executor for ``paths`` (:meth:`Session.executor`)."""
    return tuple(p.name for p in paths)


class Session:
    """One command's run (see the module docstring). Use it as a context manager, or call
    :meth:`close`."""

    def __init__(
        self,
        settings: Settings,
        *,
        interrupts: Interrupts | None = None,
        now: Callable[[], float] = time.monotonic,
        executor_factory: Callable[[Sequence[KernelPath]], Executor] | None = None,
    ) -> None:
        self.settings = settings
        self.interrupts = interrupts or process_interrupts()
        self.budget = Budget(settings.budget_s, settings.shrink_share, now)
        for plugin in settings.plugins:
            load_plugin(plugin)
        self.device = pick_device(settings.device)
        if settings.memory_share is not None and settings.isolation == "none":
            _keep_to_memory_share(self.device, settings.memory_share)
        self.paths: list[KernelPath] = resolve(list(settings.paths) if settings.paths else None)
        self._early: EarlyWorkers | None = None
        if settings.isolation == "process" and settings.prestart and executor_factory is None:
            from difftest.execution.isolation.early import EarlyWorkers

            self._early = EarlyWorkers(
                settings.prestart,
                paths=[p.name for p in self.paths],
                device=self.device,
                plugins=settings.plugins,
                tolerance=settings.tolerance,
                memory_share=settings.memory_share,
            )
        try:
            self.unavailable: dict[str, str] = {
                p.name: reason for p in self.paths if (reason := p.availability(self.device))
            }
            if settings.require_paths and settings.paths and self.unavailable:
                name, reason = next(iter(self.unavailable.items()))
                raise SetupError(f"path {name} was asked for but cannot run here: {reason}")
        except BaseException:  # no session to close them: the workers stop here
            self._stop_early()
            raise
        self.deadline = settings.deadline or Deadline.for_device(self.device.type)
        if settings.deadline_s is not None:
            self.deadline = dataclasses.replace(self.deadline, base_s=settings.deadline_s)
        self.quarantined: dict[str, Quarantine] = {}
        self.counters: dict[str, PathCounters] = {p.name: PathCounters() for p in self.paths}
        self.cases_run = 0
        self._factory = executor_factory
        self._executors: dict[tuple[str, ...], Executor] = {}
        self._pool: LaunchPool | None = None
        self._background = BackgroundLaunch()
        self.confirmed_hangs: set[str] = set()
        """Paths confirmed to hang (shared by the executors: one confirming rerun a path)."""
        self.variants_run: set[tuple[object, ...]] = set()
        """The compile variants of every case run so far, launches and rechecks."""
        self._unavailable_verdicts = [
            PathResult(path=name, outcome=Outcome.UNSUPPORTED, reason=reason)
            for name, reason in self.unavailable.items()
        ]
        """The ``UNSUPPORTED`` verdict of each path that cannot run here, the same for every
        case (:attr:`unavailable` is fixed when the session opens)."""
        self._path_order = {p.name: i for i, p in enumerate(self.paths)}
        """Each chosen path's place in :attr:`paths` (a verdict lists its paths so)."""
        self.recheck_compile_s = 0.0
        """Of the rechecks' time, what their kernels took in a launch that ran a compile
        variant first (as a campaign counts a first launch: its modules were built or loaded
        then); a campaign counts it as compile, not as triage."""

    # -- what runs ------------------------------------------------------------------------------

    @property
    def runnable(self) -> list[KernelPath]:
        """The chosen paths that can run on this machine."""
        return [p for p in self.paths if p.name not in self.unavailable]

    @property
    def active(self) -> list[KernelPath]:
        """The runnable paths not quarantined."""
        return [p for p in self.runnable if p.name not in self.quarantined]

    def executor(self, paths: Sequence[KernelPath] | None = None) -> Executor:
        """The session's executor for ``paths`` (default: every runnable path), of the
        session's isolation, created once per path list and closed with the session; free:
        a launch :meth:`begin_launch` started is waited for first."""
        self._background.drain()
        chosen = list(paths) if paths is not None else self.runnable
        key = _executor_key(chosen)
        if key not in self._executors:
            self._executors[key] = self._make(chosen)
        return self._configured(self._executors[key])

    def _configured(self, executor: Executor) -> Executor:
        """``executor`` held to the budget as it stands now (its end, the hang cap)."""
        executor.stop_at = self.budget.stop_at()
        if hasattr(executor, "interrupts"):
            executor.interrupts = self.interrupts
        if hasattr(executor, "hang_cap"):
            total = self.budget.total_s
            executor.hang_cap = None if total is None else max(HANG_FLOOR_S, HANG_SHARE * total)
            executor.confirmed_hangs = self.confirmed_hangs  # type: ignore[attr-defined]  # shared
        return executor

    def spawn_early(self, workers: int = 1) -> None:
        """With process isolation, start the worker(s) a campaign of ``workers`` launches at
        once will use, without waiting: their start-up (imports, the device context) runs
        while this process plans, loads the corpus or builds modules. On a GPU a pool's
        campaign also starts the session's own worker, which its first finding's recheck would
        otherwise start then (about 9 s on an H200: the four- and eight-worker campaigns of
        Run 27 stood still for as long at their first findings); on a CPU it starts in a
        second or two, and a campaign without findings never needs it."""
        if self.settings.isolation != "process" or not self.runnable:
            return
        chosen = self.launch_pool(workers).executors if workers > 1 else [self.executor()]
        if workers > 1 and self.device.type == "cuda":
            chosen = [*chosen, self.executor()]
        for executor in chosen:
            executor.spawn_early()

    def launch_pool(self, width: int) -> LaunchPool:
        """The session's pool of ``width`` executors for the runnable paths, each with its own
        worker, apart from :meth:`executor`'s (created once, closed with the session)."""
        if self._pool is None or self._pool.width != width:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            from difftest.execution.isolation.early import pool_memory_share, pool_threads

            threads = pool_threads(width)
            memory = pool_memory_share(width, self.device, self.settings.memory_share)
            self._pool = LaunchPool(
                [
                    self._make(self.runnable, threads=threads, memory_share=memory)
                    for _ in range(width)
                ]
            )
        return self._pool

    def launch_pool_bytes(self, width: int) -> int | None:
        """The most bytes one launch's K/V pool may take in a campaign of ``width`` launches
        at once (``None``: no bound): on a GPU with isolated workers, each keeping to its
        memory share, :data:`~difftest.execution.isolation.early.LAUNCH_POOL_SHARE` of a
        worker's share (a planned launch over it is split before it is sent: a launch that
        runs out of memory runs each of its cases alone after it)."""
        if self.settings.isolation != "process" or width < 2 or self.device.type != "cuda":
            return None
        from difftest.execution.isolation.early import LAUNCH_POOL_SHARE, pool_memory_share

        share = pool_memory_share(width, self.device, self.settings.memory_share)
        if share is None:
            return None
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(LAUNCH_POOL_SHARE * share * total)

    def start_launch(
        self, pool: LaunchPool, cases: Sequence[Case], check_determinism: bool = False
    ) -> Future[Ran]:
        """Start ``cases`` as one launch on the active paths in ``pool``; its verdicts are
        accounted for by :meth:`account_launch`, in the order the launches were started. A
        path quarantined while the launch runs still runs in it."""
        for executor in pool.executors:
            self._configured(executor)
        return pool.submit(cases, check_determinism, self._running(None))

    def begin_launch(
        self,
        cases: Sequence[Case],
        check_determinism: bool = False,
        only: Collection[str] | None = None,
    ) -> Future[Ran]:
        """Start ``cases`` as one launch on the active paths (``only``: those of them named),
        judged as :func:`judge_launch` judges it, on the session's executor: in the background
        where that executor runs cases in a worker process, so the caller accounts for the
        launch before, triages and draws meanwhile; at once otherwise
        (:class:`~difftest.execution.parallel.BackgroundLaunch`). Its verdicts are accounted
        for by :meth:`account_launch` with the same ``only``. Until it ends, :meth:`executor`
        waits for it."""
        executor = self.executor()
        return self._background.start(executor, cases, check_determinism, self._running(only))

    def write_ahead(
        self,
        cases: Sequence[Case],
        check_determinism: bool = False,
        only: Collection[str] | None = None,
    ) -> bool:
        """Write the launch :meth:`begin_launch` will be given next (the same arguments) to the
        worker of the launch running now, behind it, when that launch runs on the executor
        :meth:`begin_launch` will take (:meth:`~difftest.execution.parallel.BackgroundLaunch.
        write_ahead`): the worker starts it as soon as it answers the running one. ``True`` if
        written; ``False`` when no launch runs in the background on that executor, or it
        cannot."""
        executor = self._executors.get(_executor_key(self.runnable))
        if executor is None:
            return False
        return self._background.write_ahead(executor, cases, check_determinism, self._running(only))

    @property
    def launches_in_background(self) -> bool:
        """Whether :meth:`begin_launch` ran its last launch in the background (its executor's
        cases run in a worker process), not at once."""
        return self._background.in_background

    def drain(self) -> None:
        """Wait for the launch :meth:`begin_launch` left running, if any."""
        self._background.drain()

    def abandon_launch(self) -> None:
        """Stop the launch :meth:`begin_launch` left running (a second signal): its executor
        is closed, and the next one asked for starts afresh."""
        closed = self._background.abandon()
        for key, executor in list(self._executors.items()):
            if executor is closed:
                del self._executors[key]

    def account_launch(self, ran: Ran, only: Collection[str] | None = None) -> list[Judged]:
        """A launch's verdicts (pooled, or begun by :meth:`begin_launch`), accounted for as
        :meth:`evaluate_launch` accounts for them (in the order they were run), in its
        judgement."""
        self.variants_run.update(j.case.compile_variant() for j in ran.judged)
        accounted = {id(r): self._account(r, only) for r in ran.results}
        return [dataclasses.replace(j, result=accounted[id(j.result)]) for j in ran.judged]

    def _make(
        self,
        paths: Sequence[KernelPath],
        *,
        threads: int | None = None,
        memory_share: float | None = None,
    ) -> Executor:
        if self._factory is not None:
            return self._factory(paths)
        if self.settings.isolation == "process":
            from difftest.execution.isolation import IsolatedExecutor
            from difftest.execution.isolation.early import pool_memory_share

            if memory_share is None:
                # beside a launch pool the session's own worker (rechecks, shrinking) keeps to
                # the pool's share; without one, to the session's
                width = self._pool.width if self._pool is not None else 1
                memory_share = pool_memory_share(width, self.device, self.settings.memory_share)
            executor = IsolatedExecutor(
                paths,
                self.device,
                self.settings.tolerance,
                plugins=self.settings.plugins,
                deadline=self.deadline,
                threads=threads,
                memory_share=memory_share,
                skip_unfitting=self.settings.skip_unfitting,
            )
            return self._early.adopt(executor) if self._early is not None else executor
        return InProcessExecutor(
            paths,
            self.device,
            self.settings.tolerance,
            skip_unfitting=self.settings.skip_unfitting,
        )

    def evaluate_launch(
        self,
        cases: Sequence[Case],
        check_determinism: bool = False,
        only: Collection[str] | None = None,
    ) -> list[CaseResult]:
        """Every case's verdict on the active paths (``only``: those of them named), run as
        one launch (one case: alone);
        quarantined paths get an ``UNSUPPORTED`` verdict naming their quarantine. Crashes
        and hangs are counted, and a path lost :attr:`Settings.quarantine_after` times is
        quarantined."""
        executor = self.executor()
        self.variants_run.update(c.compile_variant() for c in cases)
        results = launch_results(executor, cases, check_determinism, self._running(only))
        return [self._account(r, only) for r in results]

    def _running(self, only: Collection[str] | None) -> list[str]:
        """The active paths a launch runs on (``only``: those of them named)."""
        return [p.name for p in self.active if only is None or p.name in only]

    def still_fails(self, case: Case, signature: Signature) -> bool | None:
        """Whether ``case`` still fails with ``signature`` on its path (triage's one rerun);
        ``None`` when it cannot tell: the path cannot run here or on the case, or the budget
        ended."""
        return self.still_fail([(case, signature)])[0]

    def still_fail(
        self, rechecks: Sequence[tuple[Case, Signature]], pack: int = 1
    ) -> list[bool | None]:
        """:meth:`still_fails` of each ``(case, signature)``, the cases of one path run in
        launches of up to ``pack`` (those that can share one, :mod:`packing`), judged as a
        campaign judges a launch (:func:`judge_launch`): a case that agrees in its launch
        passes; any other is rerun alone and its verdict alone is the answer. Triage rechecks
        a launch's findings so, in a few launches instead of one each."""
        answers: list[bool | None] = [None] * len(rechecks)
        by_path: dict[str, list[int]] = {}
        for i, (case, signature) in enumerate(rechecks):
            path = next((p for p in self.runnable if p.name == signature.path), None)
            if path is not None and path.support(case, self.device) is None:
                by_path.setdefault(signature.path, []).append(i)
        for name, indices in by_path.items():
            for launch in group_for_launches(indices, max(1, pack), lambda i: rechecks[i][0]):
                try:
                    judged = self._recheck_judged([rechecks[i][0] for i in launch], name)
                except BudgetSpent:
                    return answers
                for i, j in zip(launch, judged, strict=True):
                    verdict = j.result.result_for(name)
                    answers[i] = verdict is not None and signature_of(verdict) == rechecks[i][1]
        return answers

    def _recheck_judged(self, cases: Sequence[Case], path: str) -> list[Judged]:
        """:func:`judge_launch` of ``cases`` on ``path`` alone, not counted. Where the executor
        reruns a launch's cases alone itself (an isolated worker's ``judge_pack``, as a pooled
        campaign judges its launches) that is one message, the reruns included, not one more
        round trip a rerun: a launch's findings rechecked with their trigger reset are often
        all rerun alone (a four-worker bench on an H100 spent 15.3 s of its 25.3 s in such
        rechecks, 139 of their 159 messages reruns alone, while its campaign stood still:
        Run 36)."""
        executor = self.executor()
        judge_pack = getattr(executor, "judge_pack", None)
        if judge_pack is None or len(cases) < 2:
            return judge_launch(functools.partial(self._recheck_launch, path=path), cases)
        verdicts = judge_pack(cases, only=[path])
        self._first_runs(cases, [packed for packed, _ in verdicts])
        return judged_from(cases, verdicts)

    def _recheck_launch(
        self, cases: Sequence[Case], check_determinism: bool, *, path: str
    ) -> list[CaseResult]:
        """One launch of ``cases`` on ``path`` alone, not counted (a recheck is no new case)."""
        executor = self.executor()
        if len(cases) == 1:
            results = [executor.evaluate(cases[0], only=[path])]
        else:
            results = executor.evaluate_pack(cases, only=[path])
        self._first_runs(cases, results)
        return results

    def _first_runs(self, cases: Sequence[Case], results: Sequence[CaseResult]) -> None:
        """A recheck launch of ``cases`` that ran a compile variant first: its kernel time (in
        ``results``, the launch's own verdicts) is a module's build or load, counted as
        compile (:attr:`recheck_compile_s`)."""
        variants = {c.compile_variant() for c in cases}
        if not variants <= self.variants_run:  # its modules were built or loaded in it
            self.variants_run |= variants
            self.recheck_compile_s += sum(r.timings.get("kernels", 0.0) for r in results)

    def _account(self, result: CaseResult, only: Collection[str] | None = None) -> CaseResult:
        """Count ``result`` per path. ``only``: the launch ran on those paths alone (the
        paths whose module was still building when the case first ran): the case and the
        paths' unavailability were counted then, and the other paths are left out of it."""
        later = only is not None
        self.cases_run += 0 if later else 1
        wall = sum(result.timings.values())
        by_path = {r.path: r for r in result.results}
        ordered: list[PathResult] = []
        for path in self.runnable:
            counters = self.counters[path.name]
            got = by_path.get(path.name)
            if only is not None and path.name not in only:
                continue  # not asked for this time
            if got is None:  # quarantined before this case
                q = self.quarantined[path.name]
                got = PathResult(path=path.name, outcome=Outcome.UNSUPPORTED, reason=q.reason)
            if got.outcome is Outcome.UNSUPPORTED:
                counters.skipped += 1
                counters.skip_reasons[got.reason] += 1
                counters.skip_seconds += wall
            else:
                counters.ran += 1
            if got.outcome in (Outcome.CRASH, Outcome.HANG):
                counters.lost += 1
                if (
                    counters.lost >= self.settings.quarantine_after
                    and path.name not in self.quarantined
                ):
                    self.quarantined[path.name] = Quarantine(
                        path=path.name,
                        reason=f"quarantined: {counters.lost} crashes or hangs "
                        f"(last: {got.outcome.value}: {got.reason})",
                        after_cases=counters.ran,
                    )
            ordered.append(got)
        if not later:
            for verdict in self._unavailable_verdicts:
                ordered.append(verdict)  # frozen: one object serves every case
                self.counters[verdict.path].skipped += 1
                self.counters[verdict.path].skip_reasons[verdict.reason] += 1
        order = self._path_order
        ordered.sort(key=lambda r: order.get(r.path, len(order)))
        return dataclasses.replace(result, results=tuple(ordered))

    @contextmanager
    def phase(self, seconds: float | None) -> Iterator[None]:
        """Run a part of the command (one preset of a suite) within ``seconds`` of its own,
        inside the command's budget: the budget seen during the phase ends at the earlier of
        the two."""
        outer = self.budget
        if seconds is None:
            yield
            return
        total = seconds if outer.total_s is None else min(seconds, outer.remaining())
        self.budget = Budget(max(total, 0.0), outer.shrink_share, outer.now)
        try:
            yield
        finally:
            self.budget = outer

    # -- when to stop -------------------------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        return self.interrupts.stopping

    def should_stop(self, *, shrinking_pending: bool = False) -> str | None:
        """Why no further launch may start (``None``: go on)."""
        if self.interrupts.stopping:
            return f"interrupted ({self.interrupts.requested})"
        if not self.active and self.runnable:
            return "every path is quarantined"
        if not self.budget.exploring(shrinking_pending):
            return (
                BUDGET_SPENT
                if self.budget.spent()
                else "the exploration share of the budget is spent"
            )
        return None

    # -- the end ----------------------------------------------------------------------------------

    def close(self) -> None:
        self._background.close()
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for executor in self._executors.values():
            executor.close()
        self._executors.clear()
        self._stop_early()

    def _stop_early(self) -> None:
        """Stop the early workers no executor took (started, never needed)."""
        if self._early is not None:
            self._early.stop((self.settings.deadline or Deadline()).grace_s)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def device_of(settings: Settings) -> torch.device:
    """The device a session with ``settings`` would run on (for commands that only plan)."""
    return pick_device(settings.device)


def _keep_to_memory_share(device: torch.device, share: float) -> None:
    """Cases run in this process (``isolation="none"``): its allocator keeps to ``share`` of
    the GPU, as an isolated worker given the share does (off a GPU: nothing to bound)."""
    limit_memory(device, share)
