"""A path's own preparation, timed apart from its kernel call.

What a path does before the kernel on difftest's behalf (its arguments built from the batch,
layout copies included, and checked against the kernel's contract) is not the kernel's time.
A path wraps it in :func:`preparing`; :func:`difftest.execution.evaluate.run_path` takes that
time out of the path's seconds (:func:`take_prepared`) and books it as the phase
``arguments``, so the kernel share of a campaign counts the library's calls alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch


class _Prepared(threading.local):
    seconds = 0.0


_prepared = _Prepared()


@contextlib.contextmanager
def preparing(device: torch.device) -> Iterator[None]:
    """Time the block as preparation. The device's queue is drained at its end (when it
    ends normally), so the copies it queued count here, not in the kernel after it."""
    start = time.perf_counter()
    try:
        yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        _prepared.seconds += time.perf_counter() - start


def take_prepared() -> float:
    """The seconds this thread spent in :func:`preparing` since the last call."""
    seconds, _prepared.seconds = _prepared.seconds, 0.0
    return seconds
