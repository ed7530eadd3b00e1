"""Interrupts: what Ctrl-C and SIGTERM mean to a difftest command.

The first SIGINT or SIGTERM *asks* the run to stop: the launch in flight finishes, the run
writes what it found and the command exits non-zero, reporting itself interrupted. A second
signal *abandons* the work in flight (a launch, a shrink; an isolated worker is stopped): it
raises :class:`KeyboardInterrupt` inside the :func:`interruptible` section running that work,
which turns it into the same interrupted state. Outside such a section (writing the report,
say) a further signal is only counted, so what was found is always written. Nothing else in
difftest catches ``KeyboardInterrupt``.

The handlers are installed whatever the signal's disposition was: a command started as a
background job of a non-interactive shell inherits SIGINT ignored, and must still obey it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

_HANDLED = (signal.SIGINT, signal.SIGTERM)


@dataclass(slots=True)
class Interrupts:
    """The process's stop requests. ``requested``: the first signal's name, once one came."""

    requested: str | None = None
    count: int = 0
    abandonable: int = 0
    """Depth of :func:`interruptible` sections: a second signal raises only inside one."""
    finished: bool = False
    """The command is done: a signal now is only noted (exiting with the right code is all
    that is left to do)."""
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
        if self.count >= 2 and self.abandonable and not self.finished:
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
    """Install the handlers for the duration (a command's whole run). Under
    :func:`for_the_process` they stay: a command started from a shell keeps them until it
    exits, so a late second Ctrl-C cannot kill it with SIGINT's status."""
    interrupts = process_interrupts()
    interrupts.requested, interrupts.count, interrupts.finished = None, 0, False
    owned = not interrupts._previous
    interrupts.install()
    try:
        yield interrupts
    finally:
        if owned:
            interrupts.restore()
        else:
            interrupts.finished = True


def for_the_process() -> Interrupts:
    """Install the handlers for the rest of the process (console entry points)."""
    interrupts = process_interrupts()
    interrupts.install()
    return interrupts


def exit_process(code: int) -> NoReturn:
    """Exit a console command with ``code``. Its work is done, so a signal now cannot change
    the outcome: SIGINT and SIGTERM are ignored from here on. (Python's own shutdown puts
    Python-level handlers back to the default, and tearing down torch takes long enough for
    a second Ctrl-C to land there and kill the process with SIGINT's status instead of the
    exit code already reported.)"""
    if threading.current_thread() is threading.main_thread():
        for sig in _HANDLED:
            signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


def interruptible(fn: Callable[[], T], interrupts: Interrupts | None = None) -> T | None:
    """``fn()``, or ``None`` when a second signal abandoned it (the stop is then recorded in
    ``interrupts``). The one place difftest catches ``KeyboardInterrupt``."""
    interrupts = interrupts or process_interrupts()
    if interrupts.count >= 2:
        return None  # already abandoned: start nothing
    interrupts.abandonable += 1
    try:
        return fn()
    except KeyboardInterrupt:
        interrupts.requested = interrupts.requested or "SIGINT"
        return None
    finally:
        interrupts.abandonable -= 1
