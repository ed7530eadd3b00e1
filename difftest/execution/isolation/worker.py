"""The isolated worker: a spawned process that runs cases through kernel paths for its parent,
and :class:`WorkerProcess`, the parent's handle on it.

The wire protocol is JSON, one message per :class:`~multiprocessing.connection.Connection`
``send_bytes`` (never pickle, never tensors):

parent -> worker
    ``{"type": "configure", "plugins": [...], "path_names": [...], "device": str,
    "tolerance": {...} | null, "threads": int | null, "memory_share": float | null}`` once,
    first (a worker imports torch
    before it reads it: :meth:`WorkerProcess.preloading`); then
    ``{"type": "case", "case": <Case JSON>, "paths": [names], "check_determinism": bool}``,
    ``{"type": "pack", "cases": [<Case JSON>, ...], ..., "alone": bool}`` (the same, for
    cases that share one launch per path, :func:`difftest.execution.evaluate.evaluate_pack`;
    ``alone``: then rerun alone each case whose verdict in the launch has a finding,
    :func:`difftest.execution.launches.rerun_alone`) and ``{"type": "stop"}``.
worker -> parent
    ``{"type": "ready", "pid": int}`` or ``{"type": "startup_error", ...}`` once at start;
    then per case ``{"type": "result", "result": <CaseResult JSON>, "serial": int, "started":
    [names]}`` (``{"type": "results", "results": [...], ...}`` for a pack, with ``"alone":
    [<CaseResult JSON> | null, ...]`` when it asked for reruns), or ``{"type":
    "error", "serial": int, ...}`` when :func:`difftest.execution.evaluate.evaluate` itself
    raised. ``serial`` is the case message's own
    (:func:`~difftest.execution.isolation.wire.numbered`), ``started`` the paths the message
    started.

Messages are answered in the order sent, and the parent may send a case while the worker still
runs the one before (:meth:`IsolatedExecutor.send_ahead
<difftest.execution.isolation.isolated.IsolatedExecutor.send_ahead>`): the worker's pipe then
holds its next case when it finishes one.

Which path runs, and since when, is no message: the worker writes it into a small record of
shared memory before each path starts (:class:`~difftest.execution.isolation.wire.Progress`),
and the parent reads it a few times a second while a case runs long, and at once when the
worker dies. The worker ignores SIGINT (a Ctrl-C in the terminal is
the parent's to handle: a worker dying of it would be blamed on a path) and exits when its
parent is gone, so a killed campaign leaves no hung worker behind. Its stdout and stderr go to
a log file it empties as each case starts; the tail of it (a faulthandler traceback, a
library's last words) is kept in a crash's metrics.
"""

from __future__ import annotations

import ctypes
import dataclasses
import faulthandler
import functools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from difftest.execution import device_trace
from difftest.execution.isolation.wire import Progress, decode, encode
from difftest.machine.memory import (
    allocator_counters,
    allocator_words,
    out_of_memory,
    peaks_since_last,
    release_cached_memory,
)
from difftest.model.errors import DifftestError

if TYPE_CHECKING:
    import torch

    from difftest.judgement.tolerance import Tolerance
    from difftest.model.case import Case
    from difftest.model.outcome import CaseResult
    from difftest.paths.registry import KernelPath

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


# -- the worker process -------------------------------------------------------------------------


def _send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(encode(message))


def _redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (C level too) to the parent's log file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _own_process_group() -> None:
    """Leave the parent's process group. A signal sent to the command's group (Ctrl-C in a
    terminal, ``timeout``, ``kill -- -PGID``) then reaches the parent alone, whose interrupt
    rules (:mod:`difftest.execution.interrupts`) decide: the first lets the launch in flight
    finish, the second stops the worker. In the group, ``timeout``'s SIGTERM killed the worker
    mid-path and the run recorded the stop as a CRASH finding of that path, with a repro
    (docs/validation.md, Run 47). The worker still dies with its parent
    (:func:`_exit_with_parent`)."""
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:  # a session leader already (cannot happen for a spawned child)
            pass


def _exit_with_parent(parent_pid: int, kernel_signal: bool) -> None:
    """Die when the parent does. ``kernel_signal``: also ask Linux for SIGKILL at its death,
    which works even while a path holds the GIL (only safe when the parent spawned us from its
    main thread: the signal follows the spawning thread)."""
    if kernel_signal and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(70)

    if os.getppid() != parent_pid:
        os._exit(70)
    threading.Thread(target=watch, name="difftest-parent-watch", daemon=True).start()


PRELOAD_LIBRARIES = ("flashinfer",)
"""Kernel libraries of the built-in paths that a worker imports while it waits for its
configuration, when this machine has a CUDA device and the library is installed (importing
flashinfer takes about 4 s on an H200 machine). One that fails to import is left for its
paths' availability to report."""


def _preload() -> None:
    """What every worker needs whatever it is configured with: torch, difftest's evaluation,
    and (on a CUDA machine) :data:`PRELOAD_LIBRARIES`."""
    import importlib
    import importlib.util

    import torch

    import difftest.execution.evaluate
    import difftest.paths  # noqa: F401

    if torch.cuda.is_available():
        for name in PRELOAD_LIBRARIES:
            if importlib.util.find_spec(name) is not None:
                try:
                    importlib.import_module(name)
                except Exception:  # its paths' availability says why
                    pass


def serve_then_exit(conn: Connection, **settings: Any) -> None:
    """The spawned process's target: :func:`serve`, then, once the parent has stopped it, an
    exit at once. The interpreter's teardown (torch's, the device context's, a kernel
    library's) would only keep the parent waiting in :meth:`WorkerProcess.stop` (about half a
    second on a CPU machine); the operating system and the driver free what the process held.
    An error still ends the process the usual way, with its traceback in the log."""
    serve(conn, **settings)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def serve(
    conn: Connection,
    *,
    log_path: str | None,
    parent_pid: int,
    kernel_signal: bool,
    progress: Progress,
) -> None:
    """The worker's main loop: start-up, then the ``configure`` message (what
    :class:`WorkerProcess` was started with, or what a preloaded worker's adopter sends:
    :meth:`WorkerProcess.configure`), then cases."""
    _own_process_group()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent_pid, kernel_signal)
    if log_path is not None:
        _redirect_output(log_path)
    faulthandler.enable()
    if hasattr(signal, "SIGUSR1"):
        # every thread's stack into the log when the parent asks, before it stops a worker
        # that hung (WorkerProcess.dump_stacks)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        _preload()
        try:
            config = decode(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the parent stopped or discarded us before configuring us
        if config["type"] != "configure":
            return  # a stop, or nothing we can serve
        import torch

        from difftest.machine.device import limit_memory

        if config["threads"] is not None:
            torch.set_num_threads(config["threads"])
        dev = torch.device(config["device"])
        if config.get("memory_share") is not None:
            # one of several workers on this device: its allocator keeps to its share,
            # releasing its cache before it takes more (an allocation past the share raises
            # torch.OutOfMemoryError, which the parent answers by splitting the launch)
            limit_memory(dev, float(config["memory_share"]))

        from difftest.judgement.tolerance import Tolerance
        from difftest.paths import get_path, load_plugin

        for spec in config["plugins"]:
            load_plugin(spec)
        progress.paths = list(config["path_names"])
        paths = {name: get_path(name) for name in progress.paths}
        tolerance = config["tolerance"]
        tol = Tolerance(**tolerance) if tolerance is not None else None
        # Start-up work the first case would otherwise wait for, done before "ready" so that
        # a worker spawned early (IsolatedExecutor.spawn_early) has it done behind the
        # parent's own start: the device context, and each path's library imported.
        if dev.type == "cuda":
            torch.zeros(1, device=dev)
        for path in paths.values():
            path.availability(dev)
        trace = device_trace.from_env(cuda=dev.type == "cuda")
    except Exception as e:
        _send(
            conn,
            {
                "type": "startup_error",
                "message": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
                "usage": isinstance(e, DifftestError),
                "traceback": traceback.format_exc(),
            },
        )
        return
    _send(conn, {"type": "ready", "pid": os.getpid()})

    profile = _profiler()
    allocator = _allocator_log(dev, config.get("memory_share"))
    try:
        _serve_cases(
            conn, paths, dev, tol, progress, profile, trace, allocator,
            own_log=log_path is not None,
        )  # fmt: skip
    finally:
        if profile is not None:
            profile.dump()
        if trace is not None:
            trace.close()


def _serve_cases(
    conn: Connection,
    paths: dict[str, KernelPath],
    dev: torch.device,
    tol: Tolerance | None,
    progress: Progress,
    profile: _Profile | None,
    trace: device_trace.DeviceTrace | None,
    allocator: _AllocatorLog | None,
    own_log: bool,
) -> None:
    """Answer the parent's case and pack messages, in the order sent, until it stops the
    worker or is gone. Each message starts with the progress record and (``own_log``: the
    output goes to the parent's log file) the log emptied; the parent may already have written
    the next message, so the worker does both itself."""
    from difftest.execution.launches import rerun_alone
    from difftest.model.case import Case

    while True:
        asked = time.monotonic()
        try:
            if trace is not None:
                trace.wait_for_message(conn, asked)
            message = decode(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the parent closed the connection or is gone
        if message["type"] == "stop":
            return
        if profile is not None:
            profile.tick()
        if trace is not None:
            count = len(message.get("cases", ())) if message["type"] == "pack" else 1
            trace.tick(cases=count, waited_s=time.monotonic() - asked)
        if message["type"] not in ("case", "pack"):
            raise ValueError(f"unexpected message type {message['type']!r}")
        serial = int(message.get("serial", 0))
        progress.begin(serial)
        if own_log:
            _clear_log()
        short_of_memory = False
        failure: str | None = None
        cases: list[Case] | None = None
        try:
            raw = message["cases"] if message["type"] == "pack" else [message["case"]]
            chosen = [paths[n] for n in message["paths"]]
            run = functools.partial(
                _run_launch, paths=chosen, device=dev, tolerance=tol, progress=progress
            )
            cases = [Case.from_json(c, source="worker message") for c in raw]
            check = bool(message["check_determinism"])
            alone: list[CaseResult | None] | None = None
            if message["type"] == "pack" and message.get("alone"):
                verdicts = rerun_alone(run, cases, check)
                results, alone = [v[0] for v in verdicts], [v[1] for v in verdicts]
            else:
                results = run(cases, check)
        except Exception as e:
            short_of_memory = out_of_memory(e)
            failure = str(e) if short_of_memory else None
            _send(
                conn,
                {
                    "type": "error",
                    "serial": serial,
                    "exception": type(e).__name__,
                    "out_of_memory": short_of_memory,
                    "message": str(e),
                    "usage": isinstance(e, DifftestError),
                    "traceback": traceback.format_exc(),
                },
            )
        else:
            answer: dict[str, Any] = {"serial": serial, "started": progress.started()}
            if message["type"] == "pack":
                answer.update(type="results", results=[r.to_json() for r in results])
                if alone is not None:
                    answer["alone"] = [a.to_json() if a is not None else None for a in alone]
            else:
                answer.update(type="result", result=results[0].to_json())
            _send(conn, answer)
        if short_of_memory:
            # out of the except clause: the exception's frames, and the tensors they held,
            # are gone, so the cache gives all of them back
            release_cached_memory(dev)
        if allocator is not None:  # after the release: what the cache could not give back
            allocator.tick(cases, failure, message.get("paths", ()))


def _run_launch(
    launch: Sequence[Case],
    check_determinism: bool,
    *,
    paths: list[KernelPath],
    device: torch.device,
    tolerance: Tolerance | None,
    progress: Progress,
) -> list[CaseResult]:
    """One launch of ``launch`` on ``paths`` (:func:`~difftest.execution.evaluate.
    evaluate_pack`), each path's start written to the progress record."""
    from difftest.execution.evaluate import evaluate_pack

    return evaluate_pack(
        list(launch),
        paths,
        device,
        tolerance=tolerance,
        check_determinism=check_determinism,
        on_path_start=progress.start,
    )


def _clear_log() -> None:
    """Empty the log this process writes to (its stdout and stderr): what it holds after a
    crash is then the output of the message that crashed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.ftruncate(1, 0)
    except OSError:
        pass


PROFILE_DIR_ENV = "DIFFTEST_PROFILE_DIR"
"""When this environment variable names a folder, each worker profiles its case loop with
:mod:`cProfile` and writes ``worker-<pid>.prof`` there (``python -m pstats FILE``) every
:data:`PROFILE_EVERY` messages and when it stops: where a worker's time goes, on a machine
from which only files come back. The parent's side is profiled the usual way
(``python -m cProfile -o FILE -m difftest ...``)."""
PROFILE_EVERY = 20


class _Profile:
    def __init__(self, directory: str) -> None:
        import cProfile

        self.file = os.path.join(directory, f"worker-{os.getpid()}.prof")
        self.messages = 0
        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def tick(self) -> None:
        self.messages += 1
        if self.messages % PROFILE_EVERY == 0:
            self.dump()  # a worker killed later still leaves what it had

    def dump(self) -> None:
        """Write the profile so far: to a temporary file renamed over the last dump, so that a
        worker stopped while it writes (the parent ends a campaign by stopping its workers)
        leaves its last whole profile, never a truncated one that ``pstats`` cannot read."""
        self.profiler.disable()
        try:
            partial = f"{self.file}.partial"
            self.profiler.dump_stats(partial)
            os.replace(partial, self.file)
        finally:
            self.profiler.enable()


def _profiler() -> _Profile | None:
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return None
    os.makedirs(directory, exist_ok=True)
    return _Profile(directory)


ALLOCATOR_DIR_ENV = "DIFFTEST_ALLOCATOR_DIR"
"""When this environment variable names a folder, each worker on a CUDA device writes two
files there as it answers messages: ``worker-<pid>.allocator.json``, rewritten after each, its
allocator's counters so far (:func:`difftest.machine.memory.allocator_counters`), the memory
share it keeps to, the messages it answered and the most it held on any; and
``worker-<pid>.launches.jsonl``, a line a message: its cases, their pools' bytes (a packed
launch's pool is theirs stacked), the allocator's peaks while it ran
(:func:`difftest.machine.memory.peaks_since_last`), what the worker held after it (the next
launch starts from that), its paths and shape (:func:`launch_shape`), and whether it ran out
of memory; if it did, the allocator's message (:func:`difftest.machine.memory.
allocator_words`) and what the cache still held once it gave back all it could. Whether
workers at their share keep giving cached blocks back and asking the device again (each
``cudaFree`` waits for the device), and how a launch's peak compares with its pool (what a
planner would need to make launches that fit a share), are read off these files;
``ci/h200_warm_campaign.sh`` sums them per run."""


def launch_shape(cases: Sequence[Case]) -> dict[str, Any]:
    """What, besides its pool, may set a launch's memory: its dtypes, heads, head size and
    page size (equal across a packed launch), and its requests, query rows and keys summed."""
    a = cases[0].attention
    return {
        "dtypes": [a.q_dtype, a.kv_dtype, a.out_dtype],
        "heads": [a.num_qo_heads, a.num_kv_heads],
        "head_dim": a.head_dim,
        "page_size": a.page_size,
        "storage": cases[0].pool.kv_storage,
        "requests": sum(c.batch.num_requests for c in cases),
        "query_rows": sum(c.batch.num_query_rows + c.batch.padding_rows for c in cases),
        "kv_tokens": sum(c.total_kv_tokens() for c in cases),
        "max_seq_len": max(c.max_seq_len_used() for c in cases),
        "pages": sum(c.num_pages() for c in cases),
    }


class _AllocatorLog:
    def __init__(self, directory: str, dev: torch.device, share: float | None) -> None:
        self.file = os.path.join(directory, f"worker-{os.getpid()}.allocator.json")
        self.launches = os.path.join(directory, f"worker-{os.getpid()}.launches.jsonl")
        self.dev = dev
        self.share = share
        self.messages = 0
        self.reserved_peak = 0
        peaks_since_last(dev)  # the start-up's allocations are no launch's

    def tick(
        self,
        cases: Sequence[Case] | None,
        out_of_memory: str | None,
        path_names: Sequence[str] = (),
    ) -> None:
        """One more answered message, of ``cases`` (``None``: its cases were not read) run
        through the paths ``path_names`` (``out_of_memory``: the allocator's message, when it
        ran out of memory): its line, then the counters (a temporary file renamed over the
        last, so a worker stopped while it writes leaves a whole one)."""
        from difftest.execution.packing import pool_bytes

        self.messages += 1
        peaks = peaks_since_last(self.dev) or (0, 0)
        self.reserved_peak = max(self.reserved_peak, peaks[1])
        counters = allocator_counters(self.dev)
        now = counters or {}
        line: dict[str, Any] = {
            "cases": None if cases is None else len(cases),
            "pool_bytes": None if cases is None else pool_bytes(cases),
            "allocated_peak": peaks[0],
            "reserved_peak": peaks[1],
            # what the worker holds between messages; the next line's launch starts from it
            "allocated_after": now.get("allocated_bytes.all.current", 0),
            "out_of_memory": out_of_memory is not None,
            "paths": list(path_names),
        }
        if cases:
            line["shape"] = launch_shape(cases)
        if out_of_memory is not None:
            # whether the share or the device was full, and how much of the process's memory
            # was cached but unused; then what the cache still held once it gave back all it
            # could (blocks that share a segment with a live allocation stay)
            line["error"] = allocator_words(out_of_memory)[:600]
            line["reserved_after_release"] = now.get("reserved_bytes.all.current")
        with open(self.launches, "a") as f:
            f.write(json.dumps(line) + "\n")
        record = {
            "pid": os.getpid(),
            "messages": self.messages,
            "memory_share": self.share,
            "reserved_peak": self.reserved_peak,
            "counters": counters,
        }
        partial = f"{self.file}.partial"
        with open(partial, "w") as f:
            json.dump(record, f)
        os.replace(partial, self.file)


def _allocator_log(dev: torch.device, share: float | None) -> _AllocatorLog | None:
    directory = os.environ.get(ALLOCATOR_DIR_ENV)
    if not directory or dev.type != "cuda":
        return None
    os.makedirs(directory, exist_ok=True)
    return _AllocatorLog(directory, dev, share)


# -- the parent's side ------------------------------------------------------------------------

LOG_TAIL_LINES = 30
"""Lines of a dead worker's output kept in the crash result's metrics."""
STACKS_WAIT_S = 1.0
"""How long the parent waits for a hung worker's stacks (:meth:`WorkerProcess.dump_stacks`)."""
STARTUP_ERROR_EXIT_S = 30.0
"""How long the parent lets a worker that reported ``startup_error`` exit by itself (it returns
right after sending it) before stopping it with signals: its own exit, not a kill, on however
loaded a machine."""


def innermost_frame(lines: Sequence[str]) -> str | None:
    """Where the worker's serving thread was in a faulthandler dump among ``lines`` (the last
    dump's thread whose stack holds this module's loop): its innermost frame as ``function
    (folder/file:line)``; ``None`` when there is no such dump."""
    blocks: list[list[str]] = []
    for line in lines:
        text = line.strip()
        if text.endswith("(most recent call first):"):
            blocks.append([])
        elif blocks and text.startswith('File "'):
            blocks[-1].append(text)
    for frames in reversed(blocks):
        if frames and any(f'"{__file__}"' in f for f in frames):
            # File "/a/b/c.py", line 51 in name
            head, _, name = frames[0].rpartition(" in ")
            path, _, line_no = head.rpartition('", line ')
            return f"{name} ({'/'.join(path.split('/')[-2:])}:{line_no})"
    return None


_NOISE = ("Extension modules:",)


class WorkerError(DifftestError):
    """The isolated worker could not start, or died before any path ran (twice)."""


def exit_description(code: int | None) -> str:
    if code is None:
        return "worker process did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process killed by {name}"
    return f"worker process exited with code {code}"


PRELOAD_CAPACITY = 64
"""Paths a preloaded worker's progress record has room for (its paths are not known when it
starts)."""


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker serves and how: the plugins it imports, its paths, its device, the
    tolerance it judges by, torch's thread count in it (``None``: torch's default) and its
    share of the device's memory."""

    plugins: tuple[str, ...]
    path_names: tuple[str, ...]
    device: str
    tolerance: dict[str, float] | None
    threads: int | None = None
    memory_share: float | None = None
    """The share of the device's memory its allocator may hold (``None``: all); set when
    several workers share one GPU
    (:func:`~difftest.execution.isolation.early.pool_memory_share`)."""

    def message(self) -> dict[str, Any]:
        """The ``configure`` message that gives a worker these settings."""
        return {"type": "configure", **dataclasses.asdict(self)}


class WorkerProcess:
    """The parent's handle on one spawned worker: its process, connection and output log.

    Constructed with its settings, it is spawned and configured at once. :meth:`preloading`
    spawns one that imports what every worker needs while its parent is still starting, and
    is configured later, by whoever adopts it (:meth:`configure`)."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._spawn(len(settings.path_names))
        self.configure(settings)

    @classmethod
    def preloading(cls) -> WorkerProcess:
        """A worker spawned now, not yet configured (:data:`PRELOAD_CAPACITY` paths at most)."""
        worker = cls.__new__(cls)
        worker._spawn(PRELOAD_CAPACITY)
        return worker

    def _spawn(self, capacity: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.started_for: WorkerSettings | None = None
        """What the worker was configured with (an executor adopts a worker started early only
        when it serves the executor's paths with the executor's settings); ``None`` until
        :meth:`configure`."""
        # The worker opens the log by name; once it is ready the name is removed and both sides
        # keep their descriptors, so a parent killed later leaves no file behind.
        self._log_fd, self.log_path = tempfile.mkstemp(prefix="difftest-worker-", suffix=".log")
        self.conn, child = ctx.Pipe(duplex=True)
        self.progress = Progress.shared(capacity)
        self.process = ctx.Process(
            target=serve_then_exit,
            name="difftest-worker",
            kwargs={
                "conn": child,
                "log_path": self.log_path,
                "parent_pid": os.getpid(),
                "kernel_signal": threading.current_thread() is threading.main_thread(),
                "progress": self.progress,
            },
            daemon=True,
        )
        self._waits = threading.RLock()  # one thread at a time waits for the process
        self._stopped = False
        self.started_at = time.monotonic()
        try:
            self.process.start()
        except BaseException:
            self._remove_log()
            raise
        finally:
            child.close()
        self.ready = False

    def configure(self, settings: WorkerSettings) -> bool:
        """Give the worker its settings (once; it reports ready after). ``False``, and nothing
        sent, when it has them already or its progress record has no room for their paths."""
        if self.started_for is not None or len(settings.path_names) > self.progress.capacity:
            return False
        try:
            self.send(settings.message())
        except OSError:  # it died starting: waiting for it says how
            pass
        self.progress.paths = list(settings.path_names)
        self.started_for = settings
        return True

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, message: dict[str, Any]) -> None:
        self.conn.send_bytes(encode(message))

    def send_bytes(self, message: bytes) -> None:
        """Send a message encoded already (:func:`case_message`)."""
        self.conn.send_bytes(message)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message; ``None`` when ``timeout`` passes. Raises ``EOFError`` when the
        worker is gone (after delivering whatever it sent before dying)."""
        ready = multiprocessing.connection.wait(
            [self.conn, self.process.sentinel], timeout=max(timeout, 0.0)
        )
        if not ready:
            return None
        if self.conn in ready or self.conn.poll(0):
            try:
                return decode(self.conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                raise EOFError from None
        raise EOFError

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker reports ready; :class:`WorkerError` if it cannot."""
        if self.ready:
            return
        remaining = timeout_s - (time.monotonic() - self.started_at)
        try:
            message = self.receive(remaining)
        except EOFError:
            problem = f"did not start: {exit_description(self.exitcode())}{self._tail_hint()}"
        else:
            if message is None:
                problem = f"did not report ready within {timeout_s:.0f}s{self._tail_hint()}"
            elif message["type"] == "startup_error":
                problem = f"could not start: {message['message']}"
                self.stop(0.0, exit_wait_s=STARTUP_ERROR_EXIT_S)
            elif message["type"] != "ready":
                problem = f"sent {message['type']!r} instead of ready"
            else:
                self.ready = True
                self._unlink_log()
                return
        self.stop(0.0)
        raise WorkerError(f"the isolated worker {problem}")

    def exitcode(self, wait_s: float = 5.0) -> int | None:
        with self._waits:
            self.process.join(wait_s)
            return self.process.exitcode

    def log_tail(self) -> list[str]:
        """The last lines the worker wrote (empty once the log is closed)."""
        try:
            size = os.fstat(self._log_fd).st_size
            start = max(0, size - 16384)
            text = os.pread(self._log_fd, size - start, start).decode("utf-8", "replace")
        except OSError:
            return []
        lines = [
            line.rstrip()
            for line in text.splitlines()
            if line.strip() and not line.startswith(_NOISE)
        ]
        return [line[:300] for line in lines[-LOG_TAIL_LINES:]]

    def dump_stacks(self, wait_s: float = STACKS_WAIT_S) -> None:
        """Ask the worker for every thread's Python stack (faulthandler's, on SIGUSR1) in its
        log, and wait until the log stops growing or ``wait_s`` passes: where a worker that
        hung was, for the hang's verdict (:func:`innermost_frame`). The dump is written by
        the signal handler itself, so a worker blocked in a C call (a device synchronise, a
        lock) answers too; one that has gone, or cannot be signalled, adds nothing."""
        if not hasattr(signal, "SIGUSR1") or self.pid is None or not self.process.is_alive():
            return
        try:
            before = last = os.fstat(self._log_fd).st_size
            os.kill(self.pid, signal.SIGUSR1)
        except OSError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            time.sleep(0.02)
            try:
                size = os.fstat(self._log_fd).st_size
            except OSError:
                return
            if last > before and size == last:
                return  # written, and no longer growing
            last = size

    def _tail_hint(self) -> str:
        tail = self.log_tail()
        return f"; its last output: {tail[-1]}" if tail else ""

    def _unlink_log(self) -> None:
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def _remove_log(self) -> None:
        """Remove the log and close its descriptor; never raises (it runs on the way out of
        a failure, whose own error is the one to report)."""
        self._unlink_log()
        if self._log_fd >= 0:
            fd, self._log_fd = self._log_fd, -1
            try:
                os.close(fd)
            except OSError:  # closed already (seen when a worker died while it started)
                pass

    def stop(self, grace_s: float, *, polite: bool = False, exit_wait_s: float = 0.0) -> None:
        """Stop the process (``polite``: ask with a ``stop`` message first and wait ``grace_s``,
        longer while the workers trace: :func:`device_trace.stop_grace`; ``exit_wait_s``: first
        let it exit by itself that long), then SIGTERM, then SIGKILL after ``grace_s``; remove
        its log. Once: a second call, from another thread too, returns when the first is done.
        Two threads waiting for one process at once misread it (one reaps the child and the
        other's wait reports it still running: a campaign's close and a launch thread's failed
        start printed "did not exit after SIGKILL" for a worker that had exited)."""
        with self._waits:
            if self._stopped:
                return
            self._stopped = True
            if exit_wait_s > 0:
                self.process.join(exit_wait_s)
            if polite and self.process.is_alive():
                try:
                    self.send({"type": "stop"})
                except OSError:
                    pass
                self.process.join(device_trace.stop_grace(grace_s))
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(grace_s)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(10.0)
                if self.process.is_alive():  # stuck in the driver: nothing more we can do
                    log.warning("worker %s did not exit after SIGKILL", self.pid)
            self.conn.close()
            self._remove_log()
