"""Crash and hang isolation: kernel paths run in a watched worker process.

:class:`IsolatedExecutor` implements :class:`difftest.execution.executors.Executor`; a path
that kills the process is a ``CRASH``, one that overruns its :class:`Deadline` is a ``HANG``,
and the other paths' results of the same case are kept.

Names are imported on first use, so that the command line can start a worker
(:mod:`difftest.execution.isolation.preload`) before this process imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from difftest.model.lazy import lazy_names

if TYPE_CHECKING:
    from difftest.execution.isolation.deadline import Deadline
    from difftest.execution.isolation.isolated import IsolatedExecutor, RemoteError
    from difftest.execution.isolation.wire import case_result_from_json
    from difftest.execution.isolation.worker import WorkerError
    from difftest.machine.memory import DeviceMemoryError

_SOURCES = {
    "Deadline": "difftest.execution.isolation.deadline",
    "DeviceMemoryError": "difftest.machine.memory",
    "IsolatedExecutor": "difftest.execution.isolation.isolated",
    "RemoteError": "difftest.execution.isolation.isolated",
    "case_result_from_json": "difftest.execution.isolation.wire",
    "WorkerError": "difftest.execution.isolation.worker",
}

__all__ = [
    "Deadline",
    "DeviceMemoryError",
    "IsolatedExecutor",
    "RemoteError",
    "WorkerError",
    "case_result_from_json",
]


__getattr__, __dir__ = lazy_names(__name__, _SOURCES, __all__)
