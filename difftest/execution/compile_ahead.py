"""Compile behind execution: the next compile variants' modules build in spawned processes
while the cases of the current one run.

A campaign on a GPU meets a new kernel configuration every few dozen cases, and each is a JIT
build of tens of seconds to minutes (nvcc is CPU-bound) during which the GPU would sit idle.
:class:`CompileAhead` takes the cases the campaign will run next, in order, and starts one
build process per module a path needs for them (:func:`difftest.execution.warmup.builds`), at
most ``processes`` at a time. Before a launch runs, the campaign waits (:meth:`wait_for`) only
for the builds of that launch's own modules; that wait is what the report calls
``compile_wait``, apart from the build work done behind (:attr:`CompileAhead.work_s`). A
launch whose wait outlasts the campaign's patience runs on the paths that are ready, and the
paths still building (:meth:`CompileAhead.building`) judge it once their module exists (one
slow module, such as FMHAv2's, then holds up its own path only).

A build is the path run once on the case in a fresh process, which leaves the module in the
library's on-disk cache, where the process that runs the cases (the isolated worker, or this
one) finds it. A build that succeeds is recorded in the cache's ledger
(:mod:`difftest.execution.built_modules`), and a module the ledger names is not built again: in
a warm campaign a build process would only import the library and load the module, and the
launch would wait for it. A build that fails or kills its process is recorded, not raised: the
case then runs as it would have without building ahead, so a module whose build crashes is that
variant's ``CRASH`` in the isolated worker, never the command's. Each build process is in its
own process group, so closing stops the compilers it started too.
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import torch

from difftest.execution.built_modules import BuildKey, BuiltModules
from difftest.execution.warmup import WarmupResult, builds, describe
from difftest.model.case import Case
from difftest.paths.registry import KernelPath

STOP_GRACE_S = 2.0
"""Seconds a build process group has after SIGTERM before SIGKILL (on close)."""


def _build_child(
    conn: Connection, plugins: tuple[str, ...], name: str, case: dict[str, object], device: str
) -> None:
    """The build process: run path ``name`` once on ``case`` (JSON); send its result."""
    os.setpgrp()  # its own group: the parent stops the compilers with it, a Ctrl-C does not
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from difftest.execution.warmup import _process_build, _process_init

    try:
        _process_init(plugins)
        result = _process_build(name, case, device)
        message = {
            "path": result.path,
            "variant": result.variant,
            "seconds": result.seconds,
            "error": result.error,
        }
    except Exception as exc:  # a plugin that does not load, a case that does not parse
        message = {"error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
    conn.send(message)
    conn.close()


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"build process killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"build process killed by signal {-code}"
    return f"build process exited with code {code} without a result"


@dataclass(slots=True)
class _Build:
    key: BuildKey
    path: KernelPath
    case: Case
    process: BaseProcess | None = None
    conn: Connection | None = None
    started: float = 0.0
    result: WarmupResult | None = None


@dataclass(slots=True)
class CompileAhead:
    """Builds modules ahead of the cases that need them (see the module docstring).

    ``paths``/``device``: what the campaign runs. ``processes``: builds at a time.
    ``plugins``: imported in each build process, so plugin paths resolve there.
    ``now``: the clock waits are measured with. ``built``: the ledger of the modules the
    library's cache holds (:mod:`difftest.execution.built_modules`): those are not built
    again, and every build that succeeds is recorded there."""

    paths: Sequence[KernelPath]
    device: torch.device
    processes: int
    plugins: tuple[str, ...] = ()
    now: Callable[[], float] = time.monotonic
    built: BuiltModules | None = None
    cached: int = 0
    """Modules found in :attr:`built` and not built again."""
    wait_s: float = 0.0
    """Seconds :meth:`wait_for` has blocked, in all."""
    order: list[BuildKey] = field(default_factory=list)
    """Every module submitted, in the order it was submitted."""
    _builds: dict[BuildKey, _Build] = field(default_factory=dict)
    _queue: deque[_Build] = field(default_factory=deque)
    _running: list[_Build] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"compile ahead in {self.processes} processes: it must be >= 1")

    # -- what to build ----------------------------------------------------------------------

    def _needed(self, cases: Iterable[Case]) -> list[tuple[KernelPath, Case]]:
        """The modules ``cases`` need, each once: in case order, and for one case its cheap
        builds first (:attr:`KernelPath.build_cost_s`: an XQA module is ready while FMHAv2's
        still builds). Reference paths build nothing and are left out."""
        cases = list(cases)
        position = {id(c): i for i, c in reversed(list(enumerate(cases)))}
        needed = [
            (path, case)
            for path, case in builds(cases, self.paths, self.device)
            if path.side != "reference"
        ]
        return sorted(needed, key=lambda pc: (position[id(pc[1])], pc[0].build_cost_s))

    def keys(self, cases: Iterable[Case]) -> list[BuildKey]:
        """The modules ``cases`` need, each once (see :meth:`_needed`)."""
        return [(path.name, path.module_key(case)) for path, case in self._needed(cases)]

    def submit(self, cases: Iterable[Case]) -> int:
        """Queue a build for every module ``cases`` need that is not queued yet, in the order
        of :meth:`_needed`, and start what fits; the number queued."""
        added = 0
        for path, case in self._needed(cases):
            key = (path.name, path.module_key(case))
            if key in self._builds:
                continue
            build = _Build(key=key, path=path, case=case)
            self._builds[key] = build
            if self.built is not None and key in self.built:
                # in the cache already: nothing to wait for (the worker loads it)
                build.result = WarmupResult(path=path.name, variant=describe(case), seconds=0.0)
                self.cached += 1
                continue
            self._queue.append(build)
            self.order.append(key)
            added += 1
        self._advance()
        return added

    # -- waiting ----------------------------------------------------------------------------

    def wait_for(
        self,
        cases: Iterable[Case],
        *,
        until: float | None = None,
        stop: Callable[[], bool] = lambda: False,
        first: bool = False,
    ) -> float:
        """Block until every submitted build ``cases`` need has finished (or failed), the
        monotonic time ``until`` passes, or ``stop()`` says so; the seconds waited (also
        added to :attr:`wait_s`). Modules never submitted are not waited for. ``first``:
        until one of those builds that had not finished when the wait began finishes."""
        needed = [self._builds[k] for k in self.keys(cases) if k in self._builds]
        pending = [b for b in needed if b.result is None]
        start = self.now()
        while True:
            self._advance()
            done = [b.result is not None for b in pending]
            if all(done) or (first and any(done)) or stop():
                break
            timeout = 0.5
            if until is not None:
                timeout = min(timeout, until - time.monotonic())
                if timeout <= 0:
                    break
            handles: list[object] = []
            for b in self._running:
                assert b.conn is not None and b.process is not None
                handles += [b.conn, b.process.sentinel]
            wait(handles, timeout=timeout)  # type: ignore[arg-type]
        waited = self.now() - start
        self.wait_s += waited
        return waited

    def unfinished(self, cases: Iterable[Case]) -> list[BuildKey]:
        """The builds ``cases`` need that are submitted and not finished (queued or
        running)."""
        return self.still_building(self.keys(cases))

    def still_building(self, keys: Iterable[BuildKey]) -> list[BuildKey]:
        """Those of ``keys`` submitted and not finished: a lookup each, no support checks
        (for launches that wait on builds found by :meth:`unfinished` before)."""
        self._advance()
        return [k for k in keys if (b := self._builds.get(k)) is not None and b.result is None]

    def ready(self, cases: Iterable[Case]) -> bool:
        """Whether every module ``cases`` need was submitted and is built (or found built):
        they run without waiting and without a build at their first launch."""
        self._advance()
        for key in self.keys(cases):
            build = self._builds.get(key)
            if build is None or build.result is None or build.result.error:
                return False
        return True

    def building(self, cases: Iterable[Case]) -> set[str]:
        """The paths with a build ``cases`` need that is not finished: the paths that cannot
        run ``cases`` without waiting."""
        return {k[0] for k in self.unfinished(cases)}

    # -- results ----------------------------------------------------------------------------

    @property
    def results(self) -> list[WarmupResult]:
        """The finished builds, in submission order."""
        return [b.result for k in self.order if (b := self._builds[k]).result is not None]

    @property
    def work_s(self) -> float:
        """Seconds of build work finished, in all (done behind, unless waited for)."""
        return sum(r.seconds for r in self.results)

    def pending(self) -> int:
        """Builds queued or running."""
        return len(self._queue) + len(self._running)

    # -- processes --------------------------------------------------------------------------

    def _advance(self) -> None:
        """Collect finished builds and start queued ones while fewer than ``processes`` run."""
        for build in list(self._running):
            self._collect(build)
        while self._queue and len(self._running) < self.processes:
            self._start(self._queue.popleft())

    def _start(self, build: _Build) -> None:
        context = get_context("spawn")
        mine, child = context.Pipe(duplex=False)
        process = context.Process(
            target=_build_child,
            name="difftest-build",
            args=(child, self.plugins, build.path.name, build.case.to_json(), str(self.device)),
            daemon=True,
        )
        build.started = time.monotonic()
        process.start()
        child.close()
        build.process, build.conn = process, mine
        self._running.append(build)

    def _collect(self, build: _Build) -> None:
        assert build.process is not None and build.conn is not None
        message = None
        if build.conn.poll(0):
            try:
                message = build.conn.recv()
            except (EOFError, OSError):
                message = None
        elif build.process.is_alive():
            return
        build.process.join(5.0)
        build.conn.close()
        self._running.remove(build)
        seconds = time.monotonic() - build.started
        if isinstance(message, dict) and "path" in message:
            build.result = WarmupResult(**message)
            if self.built is not None and not build.result.error:
                self.built.add([build.key])
            return
        error = message["error"] if isinstance(message, dict) else _death(build.process.exitcode)
        build.result = WarmupResult(
            path=build.path.name, variant=describe(build.case), seconds=seconds, error=error
        )

    def close(self) -> None:
        """Drop queued builds and stop running ones with their compilers."""
        self._queue.clear()
        for build in self._running:
            assert build.process is not None
            if build.process.pid is not None and build.process.is_alive():
                try:
                    os.killpg(build.process.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    build.process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for build in self._running:
            assert build.process is not None and build.conn is not None
            build.process.join(max(0.0, deadline - time.monotonic()))
            if build.process.is_alive() and build.process.pid is not None:
                try:
                    os.killpg(build.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    build.process.kill()
                build.process.join(5.0)
            build.conn.close()
        self._running.clear()

    def __enter__(self) -> CompileAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
