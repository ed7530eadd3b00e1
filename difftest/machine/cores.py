"""How many launches a CPU campaign runs at once, from this machine's cores (no torch import:
the command line asks before it imports torch, :mod:`difftest.execution.isolation.preload`)."""

from __future__ import annotations

import os

CPU_WORKERS_MAX = 4
"""On a CPU, the most isolated workers a campaign runs launches in by default (one per usable
core: a case's kernels and oracle run on one torch thread there, and the parent's drawing
and recording fit beside them)."""


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_workers() -> int:
    """A CPU campaign's isolated workers by default: one per usable core, at most
    :data:`CPU_WORKERS_MAX`."""
    return max(1, min(CPU_WORKERS_MAX, usable_cores()))
