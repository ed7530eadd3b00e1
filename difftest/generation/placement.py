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

The stored tokens are planned as *runs*, not token by token: the live tokens of one request in
one page are consecutive positions in consecutive slots, and so are a page's unused slots, so a
run (its request, first position, first slot and length) stands for up to a page of tokens. A
case at the default GPU limits stores about 900,000 tokens in 16-token pages; planned token by
token on the host it cost 16-60 ms and three int64 arrays of its size to copy (the largest host
cost of a GPU campaign's case, Run 32). The per-token arrays the stores read are expanded from
the runs on the device, a launch's in a few operations (:func:`on_device`), and on the host
only where a family needs them (:func:`Placement.tokens`). ``tests/unit/test_placement.py``
holds the runs, expanded, to the token-by-token plan on many cases.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from difftest.generation import rng, values
from difftest.generation.rng import Stream
from difftest.machine import host_copy
from difftest.model.case import Case, draft_mask_rows

TABLES_KEPT = 64
"""Page tables kept (:func:`page_table`): a packed launch's cases' (up to 64) are read twice,
by their plans and by packing. A table at the default GPU limits is about 1 MB (117,000
entries a case on average), so no more are kept than a launch needs."""

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
    return stable_order(rng.host_hash(rng.key(case.seed, Stream.PAGE_ORDER), ids))


_SIGN = np.uint64(1 << 63)


def stable_order(h: np.ndarray) -> np.ndarray:
    """``np.argsort(h, kind="stable")`` of int64 ``h`` (signed order, as torch sorts; equal
    values in index order), in a third of its time on the hashes of a page order.

    numpy's stable sort of 16-bit keys is a radix sort (linear); of 64-bit keys a merge sort.
    Two radix passes order the values by their upper 32 bits (the sign bit flipped, so that
    unsigned order is signed order); values whose upper halves are equal (random hashes of
    57,000 pages have such a pair in about one case in three) are then ordered among
    themselves by their whole value, stably. At the default GPU limits a case has about
    57,000 pages: on the 2-core machine numpy's argsort of their hashes took 2.7 ms (of the
    plan's 4.7), this 0.8 (``benchmarks/bench_placement.py``)."""
    upper = ((h.view(np.uint64) ^ _SIGN) >> np.uint64(32)).astype(np.uint32)
    order = np.argsort((upper & np.uint32(0xFFFF)).astype(np.uint16), kind="stable")
    order = order[np.argsort((upper[order] >> np.uint32(16)).astype(np.uint16), kind="stable")]
    ranked = upper[order]
    tied = np.flatnonzero(ranked[1:] == ranked[:-1])
    if tied.size:
        # runs of equal upper halves: [first, last] of each, by the tied neighbours' indices
        starts = tied[np.r_[True, tied[1:] != tied[:-1] + 1]]
        ends = tied[np.r_[tied[1:] != tied[:-1] + 1, True]] + 1
        for first, last in zip(starts.tolist(), ends.tolist(), strict=True):
            run = order[first : last + 1]  # ascending indices (the passes are stable)
            order[first : last + 1] = run[np.argsort(h[run], kind="stable")]
    return order


def page_table(case: Case) -> np.ndarray:
    """int64 ``[bs, W]`` physical page ids, with the case's fill past each request's pages
    (read-only: the plan and packing both read it, so it is kept for the last few cases)."""
    return _page_table(case)


@functools.lru_cache(maxsize=TABLES_KEPT)
def _page_table(case: Case) -> np.ndarray:
    b, pool = case.batch, case.pool
    bs, width = b.num_requests, case.table_width()
    fill = pool.table_fill
    col = np.arange(width, dtype=np.int64)
    pages, shared, _, j, in_shared = _used_columns(case)
    # the used columns of a request are its first ones: row-major, a mask's cells are the
    # (request, column) pairs in their order
    used = col.reshape(1, -1) < pages.reshape(-1, 1)
    if fill == "zero":
        table = np.zeros((bs, width), dtype=np.int64)
    elif fill == "stale_pages":
        # hashed only where no used column is written over it (about half the table at the
        # default GPU limits), each row's part of the hash once
        table = np.empty((bs, width), dtype=np.int64)
        rows, cols = np.nonzero(~used)
        per_row = rng.host_hash(rng.key(case.seed, Stream.STALE_PAGES), np.arange(bs))
        table[rows, cols] = np.remainder(rng.host_hash(per_row[rows], cols), case.num_pages())
    else:
        table = np.repeat((OUT_OF_RANGE_BASE + col).reshape(1, -1), bs, axis=0)
    # the used columns, written over the fill: a request's shared prefix pages, then its own
    own = pages - shared
    first_own = pool.shared_prefix_pages + np.cumsum(own) - own  # logical id of the first
    logical = j + np.repeat(first_own - shared, pages)  # past the shared prefix pages
    logical[in_shared] = j[in_shared]
    table[used] = page_permutation(case)[logical]
    table.flags.writeable = False
    return table


class _UsedColumns(NamedTuple):
    """Each request's pages and shared prefix pages (0 for a padding request), and every
    used page column of every request, request by request (:func:`tokens_of` the pages: what
    the page table fills and the plan's runs follow), with whether it is a shared prefix page."""

    pages: np.ndarray
    shared: np.ndarray
    req: np.ndarray
    col: np.ndarray
    in_shared: np.ndarray


@functools.lru_cache(maxsize=4)
def _used_columns(case: Case) -> _UsedColumns:
    """The :class:`_UsedColumns` of ``case``: read-only, kept for the last few cases (the
    page table and the plan each read them)."""
    pages = np.asarray(case.pages_per_request(), dtype=np.int64)
    requests = np.arange(pages.size)
    shared = np.where(requests < len(case.batch.prefix_lens), case.pool.shared_prefix_pages, 0)
    req, col = tokens_of(pages)
    used = _UsedColumns(pages, shared, req, col, col < np.repeat(shared, pages))
    for array in used:
        array.flags.writeable = False
    return used


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
    run_req: np.ndarray
    """int64 ``[P]``: each run's request (``-1``: a shared prefix page's tokens). A run is the
    live tokens of one request in one page (see the module's docstring), in token order:
    request by request, page by page."""
    run_token: np.ndarray
    """int64 ``[P]``: its first token's position in its request."""
    run_slot: np.ndarray
    """int64 ``[P]``: its first token's pool slot (``page * page_size + offset``)."""
    run_len: np.ndarray
    """int64 ``[P]``: its tokens (1 .. page size)."""
    stale_slot: np.ndarray | None
    """int64 ``[S]``: the first slot of each run of pool slots no live token holds, in slot
    order (``None`` when the pool is zero-filled)."""
    stale_len: np.ndarray | None
    """int64 ``[S]``: each such run's slots."""
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
    outlier_key: np.ndarray | None
    """int64 ``[1]``: ``outlier_tokens``' hash key (:func:`values.outlier_key`), from
    which each stored token's factor is computed where the tokens are expanded
    (:class:`DevicePlacement`'s ``outlier_factor``)."""
    near_ties_base: np.ndarray | None
    """float64 ``[H_kv, D]``: ``near_ties``' per-(head, dim) base of the keys."""
    sinks: np.ndarray | None
    """float32 ``[H_q]``: the sinks, when the case has them."""

    def tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """int64 ``(key_req, token, slot)`` of every stored live token, expanded from the runs
        on the host: its request (``-1``: shared prefix), its position, its pool slot."""
        run, offset = tokens_of(self.run_len)
        return self.run_req[run], self.run_token[run] + offset, self.run_slot[run] + offset

    def stale(self) -> np.ndarray | None:
        """int64: every pool slot no live token holds, ascending (``None``: zero-filled)."""
        if self.stale_slot is None or self.stale_len is None:
            return None
        run, offset = tokens_of(self.stale_len)
        slots: np.ndarray = self.stale_slot[run] + offset
        return slots

    def on(self, device: torch.device) -> DevicePlacement:
        """The plan as tensors on ``device``: one copy to a GPU (queued, no wait), views of
        arrays on a CPU (:func:`difftest.machine.host_copy.to_device`)."""
        return on_device([self], device)[0]


_RUN_FIELDS = ("run_req", "run_token", "run_slot", "run_len", "stale_slot", "stale_len")
""":class:`Placement`'s runs, which reach a device expanded (:class:`DevicePlacement`'s
``key_req``, ``token``, ``slot`` and ``stale``)."""


def on_device(plans: Sequence[Placement], device: torch.device) -> list[DevicePlacement]:
    """Each of ``plans`` as tensors on ``device``, all of them in one copy to a GPU (a packed
    launch's cases: one copy for the launch, not one a case). The runs of every plan are
    expanded to per-token tensors (and the outlier factors computed): on a CPU by numpy
    (:meth:`Placement.tokens`), elsewhere on the device by a few operations for the whole
    launch, none of which waits for it (:class:`_LaunchRuns`)."""
    names = [f.name for f in dataclasses.fields(Placement) if f.name not in _RUN_FIELDS]
    copied = [name for name in names if name != "outlier_key"]
    arrays: dict[tuple[int | str, str], np.ndarray] = {
        (i, name): value
        for i, plan in enumerate(plans)
        for name in copied
        if (value := getattr(plan, name)) is not None
    }
    on_host = device.type == "cpu" and not host_copy.ONE_COPY_ON_CPU
    runs = None if on_host else _LaunchRuns(plans)
    if runs is not None:
        arrays.update({("runs", name): a for name, a in runs.arrays.items()})
    moved = host_copy.to_device(arrays, device)
    if runs is not None:
        expanded = runs.expanded({name: moved["runs", name] for name in runs.arrays})
    out = []
    for i, plan in enumerate(plans):
        fields: dict[str, Any] = {name: moved.get((i, name)) for name in copied}  # None: absent
        if runs is None:
            key_req, token, slot = plan.tokens()
            stale = plan.stale()
            factor = None
            if plan.outlier_key is not None:
                factor = values.outlier_factors(int(plan.outlier_key[0]), key_req, token)
            fields.update(
                key_req=torch.from_numpy(key_req),
                token=torch.from_numpy(token),
                slot=torch.from_numpy(slot),
                stale=None if stale is None else torch.from_numpy(stale),
                outlier_factor=None if factor is None else torch.from_numpy(factor),
            )
        else:
            fields.update(expanded[i]._asdict())
        out.append(DevicePlacement(**fields))
    return out


class _Expanded(NamedTuple):
    """One plan's per-token tensors on the device, cut from its launch's."""

    key_req: torch.Tensor
    token: torch.Tensor
    slot: torch.Tensor
    stale: torch.Tensor | None
    outlier_factor: torch.Tensor | None


class _LaunchRuns:
    """A launch's runs laid out for expansion on the device: the live runs of the plans with
    outlier factors first, then the other plans' live runs, then every plan's stale runs, so
    that one hash over a prefix of the launch's tokens gives every outlier factor. Each plan's
    live tokens and its stale slots are each a contiguous part of the launch's."""

    def __init__(self, plans: Sequence[Placement]) -> None:
        outlier = [i for i, p in enumerate(plans) if p.outlier_key is not None]
        self.outlier = set(outlier)
        order = outlier + [i for i, p in enumerate(plans) if p.outlier_key is None]
        lengths, reqs, tokens, slots, keys = [], [], [], [], []
        self.live: dict[int, tuple[int, int]] = {}
        self.stale: dict[int, tuple[int, int]] = {}
        at = 0
        for i in order:
            plan = plans[i]
            n = int(plan.run_len.sum())
            self.live[i] = (at, n)
            at += n
            lengths.append(plan.run_len)
            reqs.append(plan.run_req)
            tokens.append(plan.run_token)
            slots.append(plan.run_slot)
            if plan.outlier_key is not None:
                keys.append(np.broadcast_to(plan.outlier_key, plan.run_len.shape))
        self.hashed = sum(self.live[i][1] for i in outlier)
        """The launch's first tokens, those of the plans with outlier factors."""
        for i, plan in enumerate(plans):
            if plan.stale_slot is not None and plan.stale_len is not None:
                n = int(plan.stale_len.sum())
                self.stale[i] = (at, n)
                at += n
                lengths.append(plan.stale_len)
                reqs.append(np.zeros_like(plan.stale_len))
                tokens.append(np.zeros_like(plan.stale_len))
                slots.append(plan.stale_slot)
        self.total = at
        self.count = len(plans)
        length = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        starts = np.cumsum(length) - length
        cat = np.concatenate
        self.arrays = {
            "len": length,
            "req": cat(reqs) if reqs else length,
            "token": (cat(tokens) if tokens else length) - starts,
            "slot": (cat(slots) if slots else length) - starts,
            "key": cat(keys) if keys else np.zeros(0, dtype=np.int64),
        }
        """Each run's length, request, first position and first slot (less the run's first
        index among the launch's tokens: a token's value is its run's plus its index) and,
        for the hashed runs, the outlier key."""

    def expanded(self, on: dict[str, torch.Tensor]) -> list[_Expanded]:
        """Each plan's per-token tensors from :attr:`arrays` on the device (``on``): each
        token's run by one ``repeat_interleave`` given its output size (no wait), then a
        gather and an add each, and one hash for the outlier factors."""
        run = torch.repeat_interleave(on["len"], output_size=self.total)
        index = torch.arange(self.total, dtype=torch.int64, device=run.device)
        key_req = on["req"][run]
        token = on["token"][run] + index
        slot = on["slot"][run] + index
        factors = None
        if self.outlier:
            first = slice(0, self.hashed)
            factors = values.outlier_factors_on(on["key"][run[first]], key_req[first], token[first])
        out = []
        for i in range(self.count):
            at, n = self.live[i]
            live = slice(at, at + n)
            stale = None
            if i in self.stale:
                s_at, s_n = self.stale[i]
                stale = slot[s_at : s_at + s_n]
            factor = factors[live] if factors is not None and i in self.outlier else None
            out.append(_Expanded(key_req[live], token[live], slot[live], stale, factor))
        return out


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class DevicePlacement:
    """:class:`Placement`'s arrays as tensors on one device (same names, same dtypes), its
    runs expanded to one element a stored token or stale slot."""

    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    key_req: torch.Tensor
    """int64 ``[N]``: each stored live token's request (``-1``: a shared prefix token)."""
    token: torch.Tensor
    """int64 ``[N]``: its position in its request."""
    slot: torch.Tensor
    """int64 ``[N]``: its pool slot (``page * page_size + offset``)."""
    stale: torch.Tensor | None
    """int64: the pool slots no live token holds, ascending (``None``: zero-filled)."""
    query_req: torch.Tensor
    query_row: torch.Tensor
    query_slot: torch.Tensor
    pad_row: torch.Tensor
    new_tokens: torch.Tensor
    draft_mask: torch.Tensor
    outlier_factor: torch.Tensor | None
    """float64 ``[N]``: ``outlier_tokens``' factor of each stored token (16 or 1)."""
    near_ties_base: torch.Tensor | None
    sinks: torch.Tensor | None


def place(case: Case) -> Placement:
    """The :class:`Placement` of ``case``."""
    a, b, pool = case.attention, case.batch, case.pool
    ps = a.page_size
    seq_lens = np.asarray(b.seq_lens(), dtype=np.int64)
    table = page_table(case)
    # a run per live (request, page), in token order; a shared prefix page's tokens are
    # stored once, with request 0's, as request -1
    pages, _, req, col, in_shared = _used_columns(case)
    run_slot = table.ravel()[req * table.shape[1] + col] * ps
    lens = np.repeat(seq_lens, pages)  # each used page's request's length
    if in_shared.any():
        once = ~in_shared | (req == 0)
        req, col, run_slot, lens = req[once], col[once], run_slot[once], lens[once]
        run_req = np.where(in_shared[once], -1, req)
    else:
        run_req = req.copy()
    run_token = col * ps
    run_len = np.minimum(ps, lens - run_token)
    stale_slot = stale_len = None
    if pool.stale_fill != "zeros":
        # a page's live tokens fill its first slots; the rest of it, or all of an unused
        # page, is a stale run
        filled = np.zeros(case.num_pages(), dtype=np.int64)
        filled[run_slot // ps] = run_len
        page = np.flatnonzero(filled < ps)
        stale_slot = page * ps + filled[page]
        stale_len = ps - filled[page]
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
    outlier = None
    if family == "outlier_tokens":
        outlier = np.array([values.outlier_key(case.seed)], dtype=np.int64)
    base = None
    if family == "near_ties":
        base = values.near_ties_base(case.seed, a.num_kv_heads, a.head_dim)
    sinks = None
    if a.sinks:
        sinks = values.sink_values(case.values, case.seed, a.num_qo_heads).astype(np.float32)
    return Placement(
        seq_lens=seq_lens.astype(np.int32),
        block_tables=table.astype(np.int32),
        run_req=run_req,
        run_token=run_token,
        run_slot=run_slot,
        run_len=run_len,
        stale_slot=stale_slot,
        stale_len=stale_len,
        query_req=query_req,
        query_row=query_row,
        query_slot=np.arange(rows + b.padding_rows, dtype=np.int64),
        pad_row=np.arange(b.padding_rows, dtype=np.int64),
        new_tokens=new_tokens,
        draft_mask=np.asarray(draft_mask_rows(b.draft, b.q_len), dtype=bool).reshape(
            b.q_len, b.q_len
        ),
        outlier_key=outlier,
        near_ties_base=base,
        sinks=sinks,
    )
