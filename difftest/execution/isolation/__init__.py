"""Crash and hang isolation: kernel paths run in a watched worker process.

:class:`IsolatedExecutor` implements :class:`difftest.execution.executors.Executor`; a path
that kills the process is a ``CRASH``, one that overruns its :class:`Deadline` is a ``HANG``,
and the other paths' results of the same case are kept.
"""

from __future__ import annotations

from difftest.execution.isolation.deadline import Deadline
from difftest.execution.isolation.isolated import IsolatedExecutor, RemoteError
from difftest.execution.isolation.wire import case_result_from_json
from difftest.execution.isolation.worker import WorkerError

__all__ = [
    "Deadline",
    "IsolatedExecutor",
    "RemoteError",
    "WorkerError",
    "case_result_from_json",
]
