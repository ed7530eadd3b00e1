"""Where a launch's time goes: named ranges for :mod:`torch.profiler`, the device's queue
drained before a clock is read, and a launch's time shared among its cases by query rows."""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import torch

from difftest.model.case import Case


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a clock read after it counts that work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase(name: str) -> AbstractContextManager[object]:
    """A range named ``difftest.<name>`` for :mod:`torch.profiler` (what
    ``benchmarks/profile_gpu_time.py`` sums device time by), only while a profiler runs: a
    range costs a dispatched call on entry and on exit (~7 us), about a dozen a case."""
    if not _profiling():
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"difftest.{name}")


def _profiling() -> bool:
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return True if enabled is None else bool(enabled())


class Timed(Protocol):
    """A case of a launch, with its time split by phase."""

    @property
    def case(self) -> Case: ...

    @property
    def timings(self) -> MutableMapping[str, float]: ...


def share(members: Sequence[Timed], name: str, seconds: float) -> None:
    """Add ``seconds`` of phase ``name`` to the members, each its share by query rows."""
    rows = [m.case.batch.num_query_rows for m in members]
    for m, n in zip(members, rows, strict=True):
        m.timings[name] = m.timings.get(name, 0.0) + seconds * n / max(1, sum(rows))
