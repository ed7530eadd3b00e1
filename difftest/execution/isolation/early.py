"""Workers started before the executors that will use them exist.

A worker's start (importing torch, the device context, the paths' libraries: about 9 s on an
H200) was the first launch's wait. A session starts its workers as it opens, before it asks
which paths can run here (which imports those libraries in this process too), for every path
it was given; each executor it makes later takes one that fits it (:meth:`EarlyWorkers.adopt`)
instead of starting its own. A worker no executor takes is stopped with the session. The
first of them are the workers the command line started before it imported torch, when there
are any (:mod:`difftest.execution.isolation.preload`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from difftest.execution.executors import Executor
from difftest.execution.isolation import preload
from difftest.execution.isolation.isolated import IsolatedExecutor
from difftest.execution.isolation.worker import WorkerProcess, WorkerSettings
from difftest.judgement.tolerance import Tolerance


def pool_threads(width: int) -> int:
    """The torch threads each of a launch pool's ``width`` workers computes on: a share of this
    process's (one each on two cores: two workers of two threads each on two cores are several
    times slower)."""
    return max(1, torch.get_num_threads() // width)


POOL_MEMORY = 0.85
"""The share of a GPU's memory a launch pool's workers' allocators hold together at most: the
rest is for what no allocator of theirs counts (each process's CUDA context, Triton's and the
kernel libraries' own allocations, a kernel's local memory at launch)."""


LAUNCH_POOL_SHARE = 0.6
"""The share of a pool worker's memory (:func:`pool_memory_share`) one launch's K/V pool may
take: a campaign splits a planned launch whose pool would take more before sending it. A
launch also holds what its worker keeps between launches (0.82 GiB on an H100 with 0.7.4) and
what it makes beside its pool (its arguments, the oracle's; median 0.29 GiB, up to 3.3). In
Run 47's eight-worker campaign (7.48 GiB a worker), 40 of the 56 launches whose pools took
more than 5.0 GiB ran out of memory, none of the 25 between 4.0 and 5.0 GiB, and 1 of the
about 900 below; each that ran out then ran its cases alone, one launch each."""


def pool_memory_share(width: int, device: torch.device, total: float | None = None) -> float | None:
    """The share of the device's memory each of a launch pool's ``width`` workers may hold
    (``None``: no bound, for one worker or a CPU), out of ``total``, the session's share
    (``None``: the whole device, of which the workers hold :data:`POOL_MEMORY`). The
    session's own worker (shrinking, rechecks) runs beside the pool, so the share is cut
    ``width + 1`` ways. Without a bound each worker's allocator keeps the peak of its largest
    launch cached, and eight of them ran an H200 out of memory in a Triton kernel's launch
    (2026-12-05)."""
    if device.type != "cuda":
        return None
    if width < 2:
        return total
    return (POOL_MEMORY if total is None else total) / (width + 1)


class EarlyWorkers:
    """``count`` workers started now for ``paths`` (see the module docstring), with the
    threads each will compute on (all of this process's for one, a share each for a pool)
    and the memory each may hold (``memory_share``: the session's; a share of it each for a
    pool, :func:`pool_memory_share`)."""

    def __init__(
        self,
        count: int,
        *,
        paths: Sequence[str],
        device: torch.device,
        plugins: Sequence[str],
        tolerance: Tolerance,
        memory_share: float | None = None,
    ) -> None:
        settings = WorkerSettings(
            plugins=tuple(plugins),
            path_names=tuple(paths),
            device=str(device),
            tolerance=tolerance.to_json(),
            threads=torch.get_num_threads() if count == 1 else pool_threads(count),
            memory_share=pool_memory_share(count, device, memory_share),
        )
        self.waiting: list[WorkerProcess] = []
        """Started, not yet taken by an executor."""
        if not paths or not count:
            return
        while len(self.waiting) < count and (started := preload.take()) is not None:
            if started.configure(settings):
                self.waiting.append(started)
            else:
                started.stop(1.0)
        while len(self.waiting) < count:
            self.waiting.append(WorkerProcess(settings))

    def adopt(self, executor: Executor) -> Executor:
        """``executor``, given a waiting worker that fits it (:meth:`IsolatedExecutor.adopt`)."""
        if isinstance(executor, IsolatedExecutor):
            for worker in self.waiting:
                if executor.adopt(worker):
                    self.waiting.remove(worker)
                    break
        return executor

    def stop(self, grace_s: float) -> None:
        """Stop the workers no executor took."""
        for worker in self.waiting:
            worker.stop(grace_s, polite=True)
        self.waiting.clear()
