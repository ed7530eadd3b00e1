"""Interrupts: what Ctrl-C and SIGTERM mean to a difftest command.

The first SIGINT or SIGTERM *asks* the run to stop: the launch in flight finishes, the run
writes what it found and the command exits non-zero, reporting itself interrupted. A second
signal *abandons* the launch in flight (an isolated worker is stopped): it raises
:class:`KeyboardInterrupt` at once, which :func:`interruptible` turns into the same
interrupted state. Nothing else in difftest catches ``KeyboardInterrupt``.

The handlers are installed whatever the signal's disposition was: a command started as a
background job of a non-interactive shell inherits SIGINT ignored, and must still obey it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

_HANDLED = (signal.SIGINT, signal.SIGTERM)


@dataclass(slots=True)
class Interrupts:
    """The process's stop requests. ``requested``: the first signal's name, once one came."""

    requested: str | None = None
    count: int = 0
    _previous: dict[int, Any] = field(default_factory=dict)

    def install(self) -> None:
        """Take SIGINT and SIGTERM (main thread only; elsewhere signals cannot be handled)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for sig in _HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.requested is None:
            self.requested = signal.Signals(signum).name
        if self.count >= 2:
            raise KeyboardInterrupt

    def request(self, why: str) -> None:
        """Ask for a stop from code (tests, a parent telling a child)."""
        self.count += 1
        self.requested = self.requested or why

    @property
    def stopping(self) -> bool:
        return self.requested is not None


_PROCESS = Interrupts()


def process_interrupts() -> Interrupts:
    """The process-wide :class:`Interrupts` (one set of signal handlers per process)."""
    return _PROCESS


@contextmanager
def handling_signals() -> Iterator[Interrupts]:
    """Install the handlers for the duration (a command's whole run)."""
    interrupts = process_interrupts()
    interrupts.requested, interrupts.count = None, 0
    interrupts.install()
    try:
        yield interrupts
    finally:
        interrupts.restore()


def interruptible(fn: Callable[[], T], interrupts: Interrupts | None = None) -> T | None:
    """``fn()``, or ``None`` when a second signal abandoned it (the stop is then recorded in
    ``interrupts``). The one place difftest catches ``KeyboardInterrupt``."""
    interrupts = interrupts or process_interrupts()
    try:
        return fn()
    except KeyboardInterrupt:
        interrupts.requested = interrupts.requested or "SIGINT"
        return None
