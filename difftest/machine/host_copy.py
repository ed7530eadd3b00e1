"""Host arrays to a device in one copy, without waiting for the device.

A tensor made from host data on a GPU (``torch.tensor(list, device="cuda")``, or a copy from
ordinary pageable memory) makes the host wait until the device has run everything queued
before it; a copy from pinned (page-locked) memory with ``non_blocking=True`` is queued on the
stream like a kernel and the host goes on. :func:`to_device` packs a set of numpy arrays into
one pinned byte buffer, each at a 256-byte boundary (:data:`ALIGN`), and copies it once; each
array comes back as a typed view of its part. The pinned buffer is the caching host
allocator's, which does not hand it out again before the copy is done.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

import numpy as np
import torch

ONE_COPY_ON_CPU = False
"""Take the GPU's route on a CPU too (one buffer, one copy), for the tests and
``benchmarks/count_ops.py``; else a CPU gets views of the arrays themselves."""

ALIGN = 256
"""Where each array starts in the buffer, in bytes: as a fresh device allocation would (CUDA's
allocations are 256-byte aligned). Kernels may assume it (16-byte vector loads, TMA), and
Triton compiles a variant per argument pointer's 16-byte alignment, so views packed tighter
would cost compiles and could cost correctness."""

_TORCH_DTYPES = {
    np.int64: torch.int64,
    np.int32: torch.int32,
    np.float64: torch.float64,
    np.float32: torch.float32,
    np.bool_: torch.bool,
}


Key = TypeVar("Key", bound=Hashable)


def to_device(arrays: Mapping[Key, np.ndarray], device: torch.device) -> dict[Key, torch.Tensor]:
    """``arrays`` as tensors on ``device``, the same names, dtypes and shapes: on a CPU
    (unless :data:`ONE_COPY_ON_CPU`) views of the arrays, else typed views of one buffer
    moved by one copy from pinned memory (pinned on CUDA only)."""
    if device.type == "cpu" and not ONE_COPY_ON_CPU:
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    spans, size = [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        spans.append((name, a, size))
        size += -(-max(a.nbytes, 1) // ALIGN) * ALIGN
    host = torch.empty(max(size, ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    raw = host.numpy()
    for _, a, start in spans:
        raw[start : start + a.nbytes] = a.reshape(-1).view(np.uint8)
    moved = host.to(device, non_blocking=True)
    return {
        name: moved[start : start + a.nbytes].view(_TORCH_DTYPES[a.dtype.type]).view(a.shape)
        for name, a, start in spans
    }


def ints_to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 ``values`` on ``device`` (:func:`to_device` of one array)."""
    return to_device({"v": np.asarray(values, dtype=np.int64)}, device)["v"]
