"""What crosses the boundary between the campaign and its isolated worker: the messages, and
the shared record of which path the worker runs.

Messages are JSON, one per :class:`~multiprocessing.connection.Connection` ``send_bytes``
(never pickle, never tensors); :mod:`difftest.execution.isolation.worker` lists them. The
path the worker runs is no message: :class:`Progress` is a few integers of shared memory the
worker writes before each path starts, where they outlive a worker the path then kills, and
the parent reads when it wakes (a message per path cost each side a wake-up, several a case:
about 4 % of a CPU worker's time).
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from difftest.model.outcome import CaseResult
from difftest.model.strict_json import Reader

if TYPE_CHECKING:
    from difftest.model.case import Case


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def case_message(cases: Sequence[Case], paths: Sequence[str], check_determinism: bool) -> bytes:
    """The message that asks for one case (``case``) or a launch of several (``pack``): each
    case goes as its :meth:`~difftest.model.case.Case.canonical_json`, the text the campaign
    has written ahead already, not encoded again."""
    head: dict[str, object] = {"type": "case" if len(cases) == 1 else "pack"}
    head["paths"], head["check_determinism"] = list(paths), check_determinism
    texts = [c.canonical_json() for c in cases]
    body = f'"case":{texts[0]}' if len(texts) == 1 else f'"cases":[{",".join(texts)}]'
    return (json.dumps(head, separators=(",", ":"))[:-1] + "," + body + "}").encode()


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


class Progress:
    """Which of the executor's paths the worker runs, since when, and which it started, in
    shared memory: the worker writes (:meth:`start`), the parent reads (:meth:`read`) and
    clears it between cases (:meth:`clear`).

    Cells (int64): a sequence number, odd while the worker writes (the parent retries a read
    that saw it odd or changing), the running path's index plus one (0: none yet), its start
    on the monotonic clock in nanoseconds (the same clock in both processes), then one flag
    per path: started during this case."""

    _SEQ, _RUNNING, _SINCE, _FLAGS = 0, 1, 2, 3

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

    def clear(self) -> None:
        """Between cases (the worker is idle)."""
        ctypes.memset(self._cells, 0, ctypes.sizeof(self._cells))

    def start(self, name: str) -> None:
        """In the worker, just before ``name`` runs."""
        i = self.paths.index(name)
        cells = self._cells
        cells[self._SEQ] += 1
        cells[self._FLAGS + i] = 1
        cells[self._SINCE] = time.monotonic_ns()
        cells[self._RUNNING] = i + 1
        cells[self._SEQ] += 1

    def read(self) -> tuple[str | None, float, frozenset[str]]:
        """``(running path or None, its start in time.monotonic() seconds, started paths)``."""
        cells = self._cells
        for _ in range(READ_TRIES):
            seq = cells[self._SEQ]
            running, since = cells[self._RUNNING], cells[self._SINCE]
            flags = cells[self._FLAGS : self._FLAGS + len(self.paths)]
            if seq % 2 == 0 and cells[self._SEQ] == seq:
                break
            # the worker is between two writes, a moment from done (or died there: then the
            # last look stands, at worst naming the path it was about to start)
            time.sleep(0.001)
        started = frozenset(p for p, f in zip(self.paths, flags, strict=True) if f)
        name = self.paths[running - 1] if running else None
        return name, since / 1e9, started
