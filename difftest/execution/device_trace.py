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
one ``LENGTH`` seconds after that (or when the worker stops). A short
window keeps the trace small and the profiler's cost to a few seconds of the run. Without a
CUDA device the window records the host's operators instead (what the tests can see).

Beside each trace, ``worker-<pid>.window.json`` holds the window's own bounds on the wall
clock (``open_ns``, ``close_ns``, Unix nanoseconds, the clock of the trace's timestamps): a
worker that waited for work inside its window recorded no kernel then, and the kernels alone
would make its window look shorter and busier than it was (seen on an H100: windows of 3-4 s
whose kernels spanned 30 ms, in campaigns whose workers waited on compiles).
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


class WindowError(DifftestError):
    """:data:`WINDOW_ENV` is not ``START,LENGTH`` with ``START >= 0`` and ``LENGTH > 0``."""


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

    def __init__(self, directory: str, start_s: float, length_s: float, cuda: bool) -> None:
        self.file = os.path.join(directory, f"worker-{os.getpid()}.trace.json")
        self.bounds_file = window_file(self.file)
        self.start_s, self.length_s, self.cuda = start_s, length_s, cuda
        self.ready = time.monotonic()
        self.opened: float | None = None
        self.opened_ns = 0
        self.profiler: Any = None
        self.written = False

    def tick(self) -> None:
        if self.written:
            return
        now = time.monotonic()
        if self.profiler is None and now - self.ready >= self.start_s:
            self._open(now)
        elif self.opened is not None and now - self.opened >= self.length_s:
            self.close()

    def _open(self, now: float) -> None:
        import torch

        kind = torch.profiler.ProfilerActivity
        self.profiler = torch.profiler.profile(activities=[kind.CUDA if self.cuda else kind.CPU])
        self.opened_ns = time.time_ns()  # before: the profiler's first events are its start's
        self.profiler.__enter__()
        self.opened = now

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
        bounds = {"pid": os.getpid(), "open_ns": self.opened_ns, "close_ns": closed_ns}
        with open(f"{self.bounds_file}.partial", "w") as f:
            json.dump(bounds, f)
        os.replace(f"{self.bounds_file}.partial", self.bounds_file)


def from_env(cuda: bool) -> DeviceTrace | None:
    """The worker's trace window when :data:`DIR_ENV` names a folder, else ``None``."""
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    start, length = window(os.environ.get(WINDOW_ENV))
    os.makedirs(directory, exist_ok=True)
    return DeviceTrace(directory, start, length, cuda)
