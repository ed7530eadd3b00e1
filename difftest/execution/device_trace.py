"""A window of one process's device activity, recorded for ``benchmarks/device_timeline.py``.

Several isolated workers share a GPU in a pooled campaign, and the question their throughput
raises is the device's: for what share of the time did some kernel run, how many ran at once,
and whose were they. Nsight Systems answers it where it is installed; where it is not (the lent
GPU machines have Nsight Compute only), each worker can record a window of its own kernels with
:mod:`torch.profiler` (CUPTI underneath) and write it as a Chrome trace, whose timestamps are
absolute (``baseTimeNanoseconds`` plus each event's ``ts``), so the workers' windows line up
on one timeline when read together.

Set :data:`DIR_ENV` to a folder and each worker writes ``worker-<pid>.trace.json`` there;
:data:`WINDOW_ENV` (``START,LENGTH`` in seconds, default :data:`DEFAULT_WINDOW`) says when:
the window opens at the first message handled ``START`` seconds after the worker's start-up
(the trace is made as its last step, just before it reports ready) and closes at the first
one ``LENGTH`` seconds after that, or when the worker stops (a polite stop then waits for
the trace to be written: :func:`stop_grace`). A short
window keeps the trace small and the profiler's cost to a few seconds of the run. Without a
CUDA device the window records the host's operators instead (what the tests can see).

Beside each trace, ``worker-<pid>.window.json`` holds the window's own bounds on the wall
clock (``open_ns``, ``close_ns``, Unix nanoseconds, the clock of the trace's timestamps): a
worker that waited for work inside its window recorded no kernel then, and the kernels alone
would make its window look shorter and busier than it was (seen on an H100: windows of 3-4 s
whose kernels spanned 30 ms, in campaigns whose workers waited on compiles). It also holds
what the worker did in the window: the messages (launches) it handled, their cases, and the
seconds it waited for a message. A trace whose kernels stop early in a window in which the
worker kept handling launches is a trace that lost its kernels, not an idle worker
(docs/validation.md, Run 44: under MPS, eight windows held kernels for a fraction of each).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from difftest.model.errors import DifftestError

DIR_ENV = "DIFFTEST_DEVICE_TRACE_DIR"
WINDOW_ENV = "DIFFTEST_DEVICE_TRACE_WINDOW"
DEFAULT_WINDOW = (20.0, 5.0)
"""Seconds after the worker is ready that the window opens, and how long it stays open."""
WORKERS_ENV = "DIFFTEST_DEVICE_TRACE_WORKERS"
"""How many workers trace (unset: all): the first to open a window, i.e. to handle a message
once their ``START`` has passed. Eight windows at once lost most of their kernels and slowed
the campaign on an H100 under MPS (docs/validation.md, Run 44); one worker traced among eight
sees its own kernels' durations under the others' load, to set beside a one-worker run's:
slowed kernels, or a device left idle. The slot used to go to the first worker to start, which
could be one with no launch in its window (the session's own, for shrinking and rechecks): a
run with one tracing worker then left no trace (Run 47)."""


EXPORT_GRACE_S = 60.0
"""How long a polite stop of a worker waits for it to end while tracing is on
(:func:`stop_grace`): a worker stopped with its window still open writes its trace on the way
out, which takes seconds for a window of many kernels, and the usual grace of a second killed
it while it wrote (on a CPU, a run shorter than its window left no trace at all)."""


def stop_grace(grace_s: float) -> float:
    """The grace a polite stop gives a worker: :data:`EXPORT_GRACE_S` at least while
    :data:`DIR_ENV` is set (the workers trace), else ``grace_s``."""
    return max(grace_s, EXPORT_GRACE_S) if os.environ.get(DIR_ENV) else grace_s


class WindowError(DifftestError):
    """:data:`WINDOW_ENV` is not ``START,LENGTH`` with ``START >= 0`` and ``LENGTH > 0``, or
    :data:`WORKERS_ENV` is not a whole number of at least 1."""


def window(text: str | None) -> tuple[float, float]:
    """``(start, length)`` from :data:`WINDOW_ENV`'s text (``None``: the default)."""
    if text is None or not text.strip():
        return DEFAULT_WINDOW
    parts = text.split(",")
    try:
        start, length = (float(p) for p in parts)
    except ValueError:
        raise WindowError(f"{WINDOW_ENV}={text!r}: expected START,LENGTH in seconds") from None
    if not (start >= 0 and length > 0):
        raise WindowError(f"{WINDOW_ENV}={text!r}: START must be >= 0 and LENGTH > 0")
    return start, length


def window_file(trace_file: str) -> str:
    """The name of the file that holds ``trace_file``'s window bounds."""
    return trace_file.removesuffix(".trace.json") + ".window.json"


class DeviceTrace:
    """One worker's trace window (:meth:`tick` once a message, :meth:`close` when it stops)."""

    def __init__(
        self, directory: str, start_s: float, length_s: float, cuda: bool, limit: int | None = None
    ) -> None:
        self.directory, self.limit = directory, limit
        self.file = os.path.join(directory, f"worker-{os.getpid()}.trace.json")
        self.bounds_file = window_file(self.file)
        self.start_s, self.length_s, self.cuda = start_s, length_s, cuda
        self.ready = time.monotonic()
        self.opened: float | None = None
        self.opened_ns = 0
        self.messages = self.cases = 0
        self.waited_s = 0.0
        self.profiler: Any = None
        self.written = False

    def tick(self, cases: int = 1, waited_s: float = 0.0) -> None:
        """A message arrived, of ``cases`` cases, after the worker waited ``waited_s`` for it:
        open or close the window when due, and count what the window held (the message, its
        cases, the part of the wait inside the window)."""
        if self.written:
            return
        now = time.monotonic()
        if self.opened is not None:
            self.waited_s += min(waited_s, now - self.opened)
        if self.opened is None and now - self.ready >= self.start_s:
            if not claim_slot(self.directory, self.limit):
                self.written = True  # the tracing workers are all taken: this one never traces
                return
            self._open()
        elif self.opened is not None and now - self.opened >= self.length_s:
            self.close()
            return
        if self.opened is not None:
            self.messages += 1
            self.cases += cases

    def wait_for_message(self, conn: Any, asked: float) -> None:
        """Return when ``conn`` (the worker's end of its pipe) has a message; a window that
        comes due while the worker waits is closed then, on time, not at the next message
        (a worker with no work would otherwise hold its window open, and one stopped at once
        at the end of a run would never write it). ``asked``: when the wait began."""
        if self.opened is not None and not self.written:
            if not conn.poll(max(0.0, self.opened + self.length_s - time.monotonic())):
                self.waited_s += time.monotonic() - max(asked, self.opened)
                self.close()
        conn.poll(None)

    def _open(self) -> None:
        import torch

        # both clocks read together, before the profiler starts (its first events are its
        # start's): the window's length and waits (monotonic) and its bounds (the trace's
        # clock) count from one instant, so a wait inside never exceeds the bounds' span
        self.opened_ns, self.opened = time.time_ns(), time.monotonic()
        kind = torch.profiler.ProfilerActivity
        self.profiler = torch.profiler.profile(activities=[kind.CUDA if self.cuda else kind.CPU])
        self.profiler.__enter__()

    def close(self) -> None:
        """Stop recording and write the trace (to a temporary name first, so a worker stopped
        while it writes leaves no half file), once; nothing if the window never opened."""
        if self.profiler is None or self.written:
            return
        self.written = True
        closed_ns = time.time_ns()
        self.profiler.__exit__(None, None, None)
        partial = f"{self.file}.partial"
        self.profiler.export_chrome_trace(partial)
        os.replace(partial, self.file)
        bounds = {
            "pid": os.getpid(),
            "open_ns": self.opened_ns,
            "close_ns": closed_ns,
            "messages": self.messages,
            "cases": self.cases,
            "waited_s": round(self.waited_s, 6),
        }
        with open(f"{self.bounds_file}.partial", "w") as f:
            json.dump(bounds, f)
        os.replace(f"{self.bounds_file}.partial", self.bounds_file)


def workers_limit(text: str | None) -> int | None:
    """How many workers trace, from :data:`WORKERS_ENV`'s text (``None``: every one)."""
    if text is None or not text.strip():
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise WindowError(f"{WORKERS_ENV}={text!r}: expected a number of workers, at least 1")
    return count


def claim_slot(directory: str, limit: int | None) -> bool:
    """Whether this worker is one of the first ``limit`` to ask (a slot file created
    exclusively in ``directory``: one each, whichever processes ask at once, and a replaced
    worker's successor finds the slots taken); always ``True`` without a limit."""
    if limit is None:
        return True
    for slot in range(limit):
        try:
            fd = os.open(os.path.join(directory, f"slot-{slot}"), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False


def from_env(cuda: bool) -> DeviceTrace | None:
    """The worker's trace window when :data:`DIR_ENV` names a folder, else ``None`` (with
    :data:`WORKERS_ENV`, the window opens only if the worker is among the first that many to
    open one: :func:`claim_slot` at its first due message)."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    start, length = window(os.environ.get(WINDOW_ENV))
    limit = workers_limit(os.environ.get(WORKERS_ENV))
    os.makedirs(directory, exist_ok=True)
    return DeviceTrace(directory, start, length, cuda, limit)
