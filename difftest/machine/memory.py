"""Running out of memory: how it is recognised, what is given back after it, and the error for
a case that never fits.

An allocation that fails is not a bug in what ran: the launch was too large for the memory left
to this process (a worker of a pool keeps to its share of the device, ``early.pool_memory_share``).
Wherever it happens inside a case's evaluation (generation, the oracle, a path's own
allocations), the executor judges a packed launch's cases alone and runs a case alone once more
after giving its cached memory back; a case that fails twice does not fit here: a one-line
:class:`DeviceMemoryError` where the case is the user's (a replay, a shrink), or, in a campaign,
which drew the case itself and goes on, every path's ``UNSUPPORTED`` verdict with the reason
(:func:`not_fitted`), counted among the paths' skips in its report. It is never a path's own
verdict: a path that raised it would be a false finding against the kernel."""

from __future__ import annotations

import gc
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from difftest.model.errors import DifftestError
from difftest.model.outcome import CaseResult, Outcome, PathResult

if TYPE_CHECKING:  # torch is imported on use: a worker imports this before torch
    import torch

OUT_OF_MEMORY = ("OutOfMemoryError", "MemoryError")
"""The exception names of an allocation that failed (torch's CUDA allocator's, Python's)."""


class DeviceMemoryError(DifftestError):
    """One case, alone, ran out of memory twice: it does not fit here."""


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device (or host) had no memory left for what was asked: torch's
    allocator (``torch.OutOfMemoryError``), Python's (``MemoryError``), or a runtime error of a
    library that allocates on its own (a Triton kernel launch: ``Triton Error [CUDA]: out of
    memory``; a CUDA call: ``CUDA error: out of memory``)."""
    if type(e).__name__ in OUT_OF_MEMORY:
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def release_cached_memory(dev: torch.device) -> None:
    """Give the blocks torch's allocator keeps back to the device, after an allocation failed:
    other processes on the device, and this one's next launch, may use them."""
    gc.collect()
    if dev.type == "cuda":
        import torch

        torch.cuda.empty_cache()


_OTHER_PROCESS = re.compile(r"Process \d+ has [\d.]+ [KMGT]?i?B memory in use\. ?")


def allocator_words(message: str) -> str:
    """torch's out-of-memory message without its list of the device's other processes (one
    sentence each, several hundred characters with eight workers): what is left says what
    was asked, what the device had free, what this process held, its share's limit, and how
    much of what it held was cached but not handed out (the fragmentation that makes a
    worker under its share fail)."""
    return _OTHER_PROCESS.sub("", message)


ALLOCATOR_COUNTERS = (
    "num_device_alloc",
    "num_device_free",
    "num_alloc_retries",
    "num_sync_all_streams",
    "num_ooms",
    "reserved_bytes.all.current",
    "allocated_bytes.all.current",
)
"""What :func:`allocator_counters` reads from ``torch.cuda.memory_stats``: the allocator's
calls to ``cudaMalloc`` and ``cudaFree`` (each ``cudaFree`` waits for the device), the
allocations it retried after giving its cached blocks back (what a process at its memory share
does when a launch needs more than the share holds free), the allocations that failed even
so, its waits for every stream, and the bytes it holds now and hands out now (between
launches, what a worker holds for its whole life: modules' buffers, workspaces)."""


def allocator_counters(dev: torch.device) -> dict[str, int] | None:
    """This process's CUDA allocator's :data:`ALLOCATOR_COUNTERS` on ``dev`` since it
    started (``None`` off CUDA); a counter this torch does not keep is left out."""
    if dev.type != "cuda":
        return None
    import torch

    stats = torch.cuda.memory_stats(dev)
    return {name: int(stats[name]) for name in ALLOCATOR_COUNTERS if name in stats}


def peaks_since_last(dev: torch.device) -> tuple[int, int] | None:
    """The most bytes this process's CUDA allocator had handed out and had reserved on
    ``dev`` since the last call (or since it started), the peaks then reset: one launch's
    peak, read after it (``None`` off CUDA)."""
    if dev.type != "cuda":
        return None
    import torch

    stats = torch.cuda.memory_stats(dev)
    peaks = (
        int(stats.get("allocated_bytes.all.peak", 0)),
        int(stats.get("reserved_bytes.all.peak", 0)),
    )
    torch.cuda.reset_peak_memory_stats(dev)
    return peaks


def never_fitted(
    digest: str, names: list[str], device: torch.device, error: BaseException, *, skip: bool
) -> CaseResult:
    """Case ``digest``, out of memory twice on ``device`` (``error``: the second failure, or
    the worker's report of it): with ``skip`` (a campaign's executor), its result, not run on
    any of ``names`` (:func:`not_fitted`); else :class:`DeviceMemoryError`, in one line."""
    if skip:
        return not_fitted(digest, names, device)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    last = lines[-1] if lines else type(error).__name__  # a worker's: its traceback's last
    raise DeviceMemoryError(
        f"case {digest} does not fit in the memory left to a worker on {device} (out of "
        f"memory twice, the worker's cache emptied between: {last}); run it with fewer "
        "workers on the device (--workers, pytest -n) or smaller --limits"
    ) from None


UNFITTED = "not run: the case does not fit in the memory left to a worker"
"""How :func:`unfitted_reason` begins."""


def unfitted_reason(device: torch.device) -> str:
    """Why a case that never fits was not run (one text for every such case, so that a
    report counts them together)."""
    return (
        f"{UNFITTED} on {device} (out of memory twice, alone); fewer workers on the device "
        "(--workers) or smaller --limits would run it"
    )


def unfitted_count(skip_reasons: Mapping[str, int]) -> int:
    """The cases of a path's skips (reason -> count) that were not run for lack of memory."""
    return sum(n for reason, n in skip_reasons.items() if reason.startswith(UNFITTED))


def not_fitted(digest: str, names: list[str], device: torch.device) -> CaseResult:
    """Case ``digest``'s result where it never fits: ``UNSUPPORTED`` on each of ``names``."""
    reason = unfitted_reason(device)
    results = tuple(PathResult(path=n, outcome=Outcome.UNSUPPORTED, reason=reason) for n in names)
    return CaseResult(case_digest=digest, results=results)
