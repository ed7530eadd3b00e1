"""What a case may ask for: one place, applied to every case alike.

A case spec is small, but one edited field can ask for terabytes (``spare_pages: 100000``,
``head_dim: 10**6``). Every :class:`~difftest.model.case.Case` is checked against the static
caps below when it is built, whoever builds it (a generator, the shrinker, a repro file), so
nothing is ever allocated for a case past them. :func:`check_fits` adds the one check that
depends on the machine: the memory the case would take against what the device has free.

The caps sit far above anything the generators draw (``GPU_LIMITS``: 256 requests, 100k-token
prefixes) and any model served today (``L`` up to 64, 256 heads per rank, head dim 1024).
"""

from __future__ import annotations

MAX_REQUESTS = 4096
"""Requests (padding ones included)."""
MAX_SEQ_LEN = 1 << 21
"""Tokens of one request (prefix plus ``L``), and the context length."""
MAX_Q_LEN = 64
MAX_HEADS = 1024
"""Query heads (and KV heads)."""
MAX_HEAD_DIM = 1024
MAX_PAGE_SIZE = 4096
MAX_SPARE_PAGES = 4096
MAX_STATIC_PAGES = 1 << 20
"""Pages a CUDA graph's static pool may hold past a case's own (a variant's largest pool
less a small case's; the pool's elements are capped by :data:`MAX_POOL_ELEMENTS` as well)."""
MAX_PADDING_ROWS = 4096
MAX_SEED = 2**63
MAX_SCALE = 2.0**32
"""Largest (and ``1 / MAX_SCALE`` the smallest) scale a case may carry."""
MAX_POOL_ELEMENTS = 1 << 32
"""K and V elements of the whole pool (pages x page size x KV heads x head dim x 2)."""
MAX_QUERY_ELEMENTS = 1 << 30
MAX_WORK = 1 << 44
"""Multiply-adds of ``Q K^T`` (:meth:`Case.work`)."""
MEMORY_SHARE = 0.5
"""A case may take at most this share of the device's free memory."""


def estimated_bytes(
    pool_elements: int, kv_tokens: int, query_rows: int, heads: int, dim: int
) -> int:
    """A generous estimate of the peak memory of materialising a case and running the oracle
    on it: float64 staging of the pool, its stored copy and views, float64 queries and
    outputs at two precisions, and the oracle's gathered keys (chunked at 2**27 elements)."""
    pool = pool_elements * (8 + 2 + 2)
    queries = query_rows * heads * dim * 8 * 6
    gathered = min(kv_tokens * heads * dim, 1 << 27) * 8 * 4
    return pool + queries + gathered


def free_memory(device_type: str, index: int | None = None) -> int | None:
    """Bytes free on the device (``None`` when it cannot be told)."""
    if device_type == "cuda":
        try:
            import torch

            free, _ = torch.cuda.mem_get_info(index or 0)
            return int(free)
        except Exception:  # no driver, or not initialised: leave it to the allocator
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
