"""What crosses the boundary between the campaign and its isolated worker: the messages, and
the shared record of which path the worker runs.

Messages are JSON, one per :class:`~multiprocessing.connection.Connection` ``send_bytes``
(never pickle, never tensors); :mod:`difftest.execution.isolation.worker` lists them. The
path the worker runs is no message: :class:`Progress` is a few integers of shared memory the
worker writes before each path starts, where they outlive a worker the path then kills, and
the parent reads when it wakes (a message per path cost each side a wake-up, several a case:
about 4 % of a CPU worker's time).

Each case or pack message carries a serial number the parent gives it, and the worker's answer
and its progress record name the message they belong to: a parent may write a message while the
worker still runs the one before (:meth:`IsolatedExecutor.send_ahead
<difftest.execution.isolation.isolated.IsolatedExecutor.send_ahead>`), and then tells from the
serial whether what it reads is its own message's.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from difftest.model.outcome import CaseResult
from difftest.model.strict_json import Reader

if TYPE_CHECKING:
    from difftest.model.case import Case


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def case_message(
    cases: Sequence[Case], paths: Sequence[str], check_determinism: bool, alone: bool = False
) -> bytes:
    """The message that asks for one case (``case``) or a launch of several (``pack``): each
    case goes as its :meth:`~difftest.model.case.Case.canonical_json`, the text the campaign
    has written ahead already, not encoded again. ``alone`` (a pack only): the worker also
    reruns alone each case with a finding in the launch."""
    head: dict[str, object] = {"type": "case" if len(cases) == 1 else "pack"}
    head["paths"], head["check_determinism"] = list(paths), check_determinism
    if alone and len(cases) > 1:
        head["alone"] = True
    texts = [c.canonical_json() for c in cases]
    body = f'"case":{texts[0]}' if len(texts) == 1 else f'"cases":[{",".join(texts)}]'
    return (json.dumps(head, separators=(",", ":"))[:-1] + "," + body + "}").encode()


def numbered(message: bytes, serial: int) -> bytes:
    """``message`` (:func:`case_message`'s) with its serial number: the worker's answer and
    progress record carry it back."""
    return b'{"serial":%d,' % serial + message[1:]


def decode(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ValueError(f"malformed worker message: {data[:200]!r}")
    return message


def case_result_from_json(data: dict[str, Any]) -> CaseResult:
    """The inverse of :meth:`CaseResult.to_json`, read strictly."""
    return CaseResult.from_json(Reader(data, "worker message", "result"))


READ_TRIES = 100
"""Looks :meth:`Progress.read` takes at a record the worker is writing before it settles for
the last one."""


class Look(NamedTuple):
    """One reading of a :class:`Progress` record."""

    message: int
    """The serial number of the message the worker runs or ran last (0: none yet)."""
    running: str | None
    """The path running (the last one started), ``None`` before the message's first."""
    since: float
    """When it started (the message itself, before its first path), ``time.monotonic()``."""
    started: frozenset[str]
    """The paths started during the message."""


class Progress:
    """Which message the worker runs, which of the executor's paths, since when, and which it
    started, in shared memory: the worker writes (:meth:`begin` at each message, :meth:`start`
    at each path), the parent reads (:meth:`read`).

    Cells (int64): a sequence number, odd while the worker writes (the parent retries a read
    that saw it odd or changing), the message's serial number, the running path's index plus
    one (0: none yet), its start (or the message's) on the monotonic clock in nanoseconds (the
    same clock in both processes), then one flag per path: started during this message."""

    _SEQ, _MESSAGE, _RUNNING, _SINCE, _FLAGS = 0, 1, 2, 3, 4

    def __init__(self, cells: Any, paths: Sequence[str] = ()) -> None:
        self._cells = cells
        self.paths = list(paths)
        """The paths, in the order of their flags: set on both sides when the worker is
        configured (at most :attr:`capacity` of them)."""

    @classmethod
    def shared(cls, capacity: int) -> Progress:
        """A record for up to ``capacity`` paths, in memory a spawned worker inherits."""
        ctx = multiprocessing.get_context("spawn")
        return cls(ctx.RawArray(ctypes.c_int64, cls._FLAGS + capacity))

    @property
    def capacity(self) -> int:
        return len(self._cells) - self._FLAGS

    def begin(self, serial: int) -> None:
        """In the worker, as message ``serial`` starts: no path yet, none started."""
        cells = self._cells
        cells[self._SEQ] += 1
        for i in range(self._FLAGS, self._FLAGS + len(self.paths)):
            cells[i] = 0
        cells[self._RUNNING] = 0
        cells[self._SINCE] = time.monotonic_ns()
        cells[self._MESSAGE] = serial
        cells[self._SEQ] += 1

    def start(self, name: str) -> None:
        """In the worker, just before ``name`` runs."""
        i = self.paths.index(name)
        cells = self._cells
        cells[self._SEQ] += 1
        cells[self._FLAGS + i] = 1
        cells[self._SINCE] = time.monotonic_ns()
        cells[self._RUNNING] = i + 1
        cells[self._SEQ] += 1

    def started(self) -> list[str]:
        """In the worker: the paths started during this message."""
        cells = self._cells
        return [p for i, p in enumerate(self.paths) if cells[self._FLAGS + i]]

    def read(self) -> Look:
        """What the record holds now (a moment's retry while the worker writes it)."""
        cells = self._cells
        for _ in range(READ_TRIES):
            seq = cells[self._SEQ]
            message, running = cells[self._MESSAGE], cells[self._RUNNING]
            since = cells[self._SINCE]
            flags = cells[self._FLAGS : self._FLAGS + len(self.paths)]
            if seq % 2 == 0 and cells[self._SEQ] == seq:
                break
            # the worker is between two writes, a moment from done (or died there: then the
            # last look stands, at worst naming the path it was about to start)
            time.sleep(0.001)
        started = frozenset(p for p, f in zip(self.paths, flags, strict=True) if f)
        name = self.paths[running - 1] if running else None
        return Look(message, name, since / 1e9, started)

    def read_for(self, serial: int) -> Look:
        """:meth:`read`, as far as message ``serial`` goes: no path running and none started
        while the record is another message's (the worker is still on one written before)."""
        look = self.read()
        if look.message == serial:
            return look
        return Look(look.message, None, look.since, frozenset())
