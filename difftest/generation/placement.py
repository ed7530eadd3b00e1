"""Case spec -> where every value goes: the integer plan of a case, computed on the host.

Materialising a case is two kinds of work. Most of its elements are values (the pool's K and
V, the queries), drawn by the counter-based generator on the target device. Around them is a
plan of small integer arrays: the page table, each live token's request, position and pool
slot, the stale slots, each query row's request and position, the draft mask, the outlier
tokens' factors. The plan depends on the case spec alone, is a few thousand numbers where the
values are millions, and on a GPU it cost about ninety small tensor operations a case, several
of them waits for the device (a boolean index or ``nonzero`` must know its result's size, a
list copied from the host waits for the queued work before it).

Here the plan is computed on the host with numpy, whose operations on small arrays cost a
microsecond or two, and :meth:`Placement.on` moves all of it to the device in one copy
(:mod:`difftest.machine.host_copy`: from pinned memory on CUDA, queued behind the device's
work without waiting for it); on a CPU the tensors are views of the numpy arrays. The hashes
go through the same splitmix64 arithmetic as :mod:`rng` (exact, wrapping, in uint64), so the
plan is bit for bit the one the device computed before (the pinned digests of
``tests/unit/test_generation_bits.py`` hold).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from difftest.generation import rng, values
from difftest.generation.rng import Stream
from difftest.machine import host_copy
from difftest.model.case import Case, draft_mask_rows

OUT_OF_RANGE_BASE = 1 << 24
"""Table fill for ``out_of_range``: far past any pool, so a read of it faults at once."""


def page_permutation(case: Case) -> np.ndarray:
    """int64 ``[pages]``: the physical page of each logical page (logical pages are numbered
    in request order)."""
    n = case.num_pages()
    ids = np.arange(n, dtype=np.int64)
    order = case.pool.page_order
    if order == "sequential":
        return ids
    if order == "reversed":
        return ids[::-1].copy()
    # Sorting distinct 64-bit hashes (as signed int64, as torch sorts them) gives one order.
    return np.argsort(rng.host_hash(rng.key(case.seed, Stream.PAGE_ORDER), ids), kind="stable")


def page_table(case: Case) -> np.ndarray:
    """int64 ``[bs, W]`` physical page ids, with the case's fill past each request's pages."""
    b, pool = case.batch, case.pool
    bs, width = b.num_requests, case.table_width()
    shared = pool.shared_prefix_pages
    pages = np.asarray(case.pages_per_request(), dtype=np.int64)
    shared_b = np.where(np.arange(bs) < len(b.prefix_lens), shared, 0).astype(np.int64)
    own = pages - shared_b
    first_own = shared + np.cumsum(own) - own  # logical id of each request's first own page
    col = np.arange(width, dtype=np.int64).reshape(1, -1)
    logical = np.where(
        col < shared_b.reshape(-1, 1), col, first_own.reshape(-1, 1) + col - shared_b.reshape(-1, 1)
    )
    used = col < pages.reshape(-1, 1)
    physical = page_permutation(case)[np.where(used, logical, 0)]
    fill = pool.table_fill
    if fill == "zero":
        filler = np.zeros_like(physical)
    elif fill == "stale_pages":
        rows = np.arange(bs, dtype=np.int64).reshape(-1, 1)
        h = rng.host_hash(rng.key(case.seed, Stream.STALE_PAGES), rows, col)
        filler = np.remainder(h, case.num_pages())
    else:
        filler = np.broadcast_to(OUT_OF_RANGE_BASE + col, (bs, width))
    return np.where(used, physical, filler).astype(np.int64)


def tokens_of(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, position)`` of every token when owner ``i`` has ``counts[i]`` of them, in
    owner order (live K/V tokens of requests; query rows of ragged requests)."""
    owner = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return owner, np.arange(owner.size, dtype=np.int64) - starts[owner]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Placement:
    """A case's plan (host arrays; see the module's docstring). Tokens of a shared prefix are
    listed once, as request ``-1`` in ``key_req`` (their values are the same in every
    request that shares them)."""

    seq_lens: np.ndarray
    """int32 ``[bs]``: each request's prefix plus new tokens."""
    block_tables: np.ndarray
    """int32 ``[bs, W]``: :func:`page_table`."""
    key_req: np.ndarray
    """int64 ``[N]``: each stored live token's request (``-1``: a shared prefix token)."""
    token: np.ndarray
    """int64 ``[N]``: its position in its request."""
    slot: np.ndarray
    """int64 ``[N]``: its pool slot (``page * page_size + offset``)."""
    stale: np.ndarray | None
    """int64: the pool slots no live token holds (``None`` when the pool is zero-filled)."""
    query_req: np.ndarray
    """int64 ``[R]``: each query row's request."""
    query_row: np.ndarray
    """int64 ``[R]``: its row within the request."""
    query_slot: np.ndarray
    """int64 ``[R + padding]``: each query row's and padding row's row of the case's queries
    (``0 .. R + padding - 1``: where the fused store writes them)."""
    pad_row: np.ndarray
    """int64 ``[padding]``: each padding row's own index (what its values are drawn by)."""
    new_tokens: np.ndarray
    """int64 ``[bs]``: each request's query rows (``Batch.new_tokens``; ``query_req`` is
    ``Batch.row_requests``)."""
    draft_mask: np.ndarray
    """bool ``[L, L]``."""
    outlier_factor: np.ndarray | None
    """float64 ``[N]``: ``outlier_tokens``' factor of each stored token (16 or 1)."""
    near_ties_base: np.ndarray | None
    """float64 ``[H_kv, D]``: ``near_ties``' per-(head, dim) base of the keys."""
    sinks: np.ndarray | None
    """float32 ``[H_q]``: the sinks, when the case has them."""

    def on(self, device: torch.device) -> DevicePlacement:
        """The plan as tensors on ``device``: one copy to a GPU (queued, no wait), views of
        these arrays on a CPU (:func:`difftest.machine.host_copy.to_device`)."""
        return on_device([self], device)[0]


def on_device(plans: Sequence[Placement], device: torch.device) -> list[DevicePlacement]:
    """Each of ``plans`` as tensors on ``device``, all of them in one copy to a GPU (a packed
    launch's cases: one copy for the launch, not one a case)."""
    names = [f.name for f in dataclasses.fields(Placement)]
    arrays = {
        (i, name): value
        for i, plan in enumerate(plans)
        for name in names
        if (value := getattr(plan, name)) is not None
    }
    moved = host_copy.to_device(arrays, device)
    out = []
    for i in range(len(plans)):
        fields: dict[str, Any] = {name: moved.get((i, name)) for name in names}  # None: absent
        out.append(DevicePlacement(**fields))
    return out


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class DevicePlacement:
    """:class:`Placement`'s arrays as tensors on one device (same names, same dtypes)."""

    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    key_req: torch.Tensor
    token: torch.Tensor
    slot: torch.Tensor
    stale: torch.Tensor | None
    query_req: torch.Tensor
    query_row: torch.Tensor
    query_slot: torch.Tensor
    pad_row: torch.Tensor
    new_tokens: torch.Tensor
    draft_mask: torch.Tensor
    outlier_factor: torch.Tensor | None
    near_ties_base: torch.Tensor | None
    sinks: torch.Tensor | None


def place(case: Case) -> Placement:
    """The :class:`Placement` of ``case``."""
    a, b, pool = case.attention, case.batch, case.pool
    ps = a.page_size
    seq_lens = np.asarray(b.seq_lens(), dtype=np.int64)
    table = page_table(case)
    req, tok = tokens_of(seq_lens)
    in_shared = (tok < pool.shared_prefix_pages * ps) & (req < len(b.prefix_lens))
    once = ~in_shared | (req == 0)  # a shared token holds the same values in every request
    req, tok, in_shared = req[once], tok[once], in_shared[once]
    slot = table[req, tok // ps] * ps + tok % ps
    key_req = np.where(in_shared, -1, req)
    stale = None
    if pool.stale_fill != "zeros":
        free = np.ones(case.num_pages() * ps, dtype=bool)
        free[slot] = False
        stale = np.flatnonzero(free).astype(np.int64)
    new_tokens = np.asarray(b.new_tokens(), dtype=np.int64)
    rows = b.num_query_rows
    query_req: np.ndarray
    query_row: np.ndarray
    if b.is_ragged:
        query_req, query_row = tokens_of(new_tokens)
    else:
        every = np.arange(rows, dtype=np.int64)
        query_req, query_row = every // b.q_len, every % b.q_len
    family = case.values.family
    factor = values.outlier_factors(case.seed, key_req, tok) if family == "outlier_tokens" else None
    base = None
    if family == "near_ties":
        base = values.near_ties_base(case.seed, a.num_kv_heads, a.head_dim)
    sinks = None
    if a.sinks:
        sinks = values.sink_values(case.values, case.seed, a.num_qo_heads).astype(np.float32)
    return Placement(
        seq_lens=seq_lens.astype(np.int32),
        block_tables=table.astype(np.int32),
        key_req=key_req,
        token=tok,
        slot=slot,
        stale=stale,
        query_req=query_req,
        query_row=query_row,
        query_slot=np.arange(rows + b.padding_rows, dtype=np.int64),
        pad_row=np.arange(b.padding_rows, dtype=np.int64),
        new_tokens=new_tokens,
        draft_mask=np.asarray(draft_mask_rows(b.draft, b.q_len), dtype=bool).reshape(
            b.q_len, b.q_len
        ),
        outlier_factor=factor,
        near_ties_base=base,
        sinks=sinks,
    )
