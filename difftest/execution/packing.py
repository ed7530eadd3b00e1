"""Several cases in one kernel launch, each keeping exactly the arguments it has alone.

Attention is independent per request, so cases whose launch-wide arguments are equal can share
one launch: their requests are concatenated, their pools stacked, and each case's page-table
rows shifted by the pages stacked before it. The launch's arguments restricted to one case's
requests are then that case's own arguments, up to that page-id offset: the same scales,
window, sinks, draft mask, table width, ``max_seq_len``, storage layout and calling
convention. :func:`pack_key` says which cases may share a launch; :func:`pack` builds it.

Packing is an optimisation and must never change a verdict: the campaign reruns any case that
was not AGREE in a packed launch on its own (see
:func:`difftest.execution.evaluate.evaluate_pack`), and a
disagreement that shows only when packed is kept as a repro of the whole launch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from difftest.generation import placement
from difftest.generation.materialize import PAGE_DIM, hnd_view, pool_shape, query_shape
from difftest.machine import host_copy
from difftest.model.batch import DTYPES, Batch
from difftest.model.case import BatchSpec, Case
from difftest.model.errors import InvalidCase
from difftest.paths.kernel_args import max_seq_len

T = TypeVar("T")


def _identity(x: Any) -> Any:
    return x


def pack_key(case: Case) -> tuple[object, ...]:
    """Cases with equal keys may share a launch: everything a kernel takes once per launch.

    That is the whole attention configuration (dtypes, heads, page size, scales, window,
    sinks), ``L`` and the draft mask (and the draft length SGLang sizes it by), the storage
    layout, the calling convention, the page
    table's width and ``max_seq_len``; with sinks also the values that fill them.
    """
    b = case.batch
    key: tuple[object, ...] = (
        case.attention,
        b.q_len,
        b.draft,
        b.spec_draft_len,
        case.pool.kv_storage,
        case.convention,
        case.table_width(),
        max_seq_len(case),
    )
    if case.attention.sinks:  # one sink per head for the whole launch
        key += (case.values, case.seed)
    return key


def packable(cases: Sequence[Case]) -> str | None:
    """``None`` when ``cases`` can share a launch, else why not."""
    if not cases:
        return "no cases"
    first = pack_key(cases[0])
    for i, case in enumerate(cases[1:], start=1):
        if pack_key(case) != first:
            return f"case {i} differs from case 0 in a launch-wide argument"
    if any(c.batch.padding_rows for c in cases[:-1]):
        return "only the last case of a launch may have padding query rows"
    if len(cases) > 1 and any(c.graph is not None for c in cases):
        return "a graph case is replayed alone (its static buffers are its own)"
    return None


def group_for_launches(
    items: Iterable[T],
    size: int,
    case_of: Callable[[T], Case] = _identity,
    max_pool_bytes: int | None = None,
) -> Iterator[list[T]]:
    """Consecutive items grouped into launches of at most ``size`` cases, in order.

    A group ends where the pack key changes; a case with padding query rows (which must come
    last in a launch) ends its group. ``case_of``: the case of an item (default: the item).
    A group that would hold more than one case may (:func:`fits_one_launch`: at the GPU
    limits, eight large cases together can exceed the pool's element cap), or whose pool
    would take more than ``max_pool_bytes`` (:func:`pool_bytes`; ``None``: no bound), is
    split before each case that would overfill it; a case alone is never split.
    """
    group: list[T] = []
    key: tuple[object, ...] | None = None
    for item in items:
        case = case_of(item)
        item_key = pack_key(case)
        alone = case.graph is not None  # graph cases are replayed alone
        if group and (len(group) >= size or item_key != key or alone):
            yield from _fitting(group, case_of, max_pool_bytes)
            group = []
        if not group:
            key = item_key
        group.append(item)
        if case.batch.padding_rows or case.graph is not None:
            yield from _fitting(group, case_of, max_pool_bytes)
            group = []
    if group:
        yield from _fitting(group, case_of, max_pool_bytes)


def _fitting(
    group: list[T], case_of: Callable[[T], Case], max_pool_bytes: int | None
) -> Iterator[list[T]]:
    """``group`` as launches the case model accepts, each within ``max_pool_bytes``: itself,
    after one check, as nearly always; else split before each case that would overfill the
    launch so far."""
    cases = [case_of(item) for item in group]

    def fits(launch: list[Case]) -> bool:
        if max_pool_bytes is not None and len(launch) > 1 and pool_bytes(launch) > max_pool_bytes:
            return False
        return fits_one_launch(launch)

    if fits(cases):
        yield group
        return
    part, part_cases = [group[0]], [cases[0]]
    for item, case in zip(group[1:], cases[1:], strict=True):
        if fits([*part_cases, case]):
            part.append(item)
            part_cases.append(case)
        else:
            yield part
            part, part_cases = [item], [case]
    yield part


def fits_one_launch(cases: Sequence[Case]) -> bool:
    """Whether ``cases`` (packable) make a launch the case model accepts: its requests, pool
    and query rows within the caps of one case (:mod:`difftest.model.caps`)."""
    if len(cases) < 2:
        return True
    try:
        packed_case(cases)
    except InvalidCase:
        return False
    return True


def packed_case(cases: Sequence[Case]) -> Case:
    """The spec of the launch's shape: every case's requests (CUDA-graph padding requests
    become ordinary ones of prefix 1), the common ``L``, draft, table width, ``max_seq_len``
    and configuration. Its pool fields other than layout, width and context length do not
    describe the stacked pool, whose tensors come from the cases themselves."""
    reason = packable(cases)
    if reason is not None:
        raise ValueError(f"cannot pack these cases: {reason}")
    first, last = cases[0], cases[-1]
    prefix_lens = tuple(p for c in cases for p in c.batch.all_prefix_lens())
    q_lens = tuple(n for c in cases for n in c.batch.new_tokens())
    ragged = any(c.batch.is_ragged for c in cases)
    batch = BatchSpec(
        mode=first.batch.mode,
        prefix_lens=prefix_lens,
        q_len=first.batch.q_len,
        draft=first.batch.draft,
        padding_rows=last.batch.padding_rows,
        q_lens=q_lens if ragged else None,
        spec_draft_len=first.batch.spec_draft_len,
    )
    pool = dataclasses.replace(
        first.pool,
        page_order="sequential",
        spare_pages=0,
        shared_prefix_pages=0,
        context_len=first.context_len(),
    )
    packed = first.replace(batch=batch, pool=pool)
    assert packed.table_width() == first.table_width()
    assert max_seq_len(packed) == max_seq_len(first)
    return packed


@dataclass(frozen=True, eq=False, kw_only=True)
class PackedLaunch:
    """One launch's batch and where each case's query rows are in it."""

    batch: Batch
    row_starts: tuple[int, ...]
    row_counts: tuple[int, ...]

    def rows_of(self, part: int) -> slice:
        start = self.row_starts[part]
        return slice(start, start + self.row_counts[part])

    def split(self, out: torch.Tensor) -> list[torch.Tensor]:
        """A launch's output ``[R_total, H_q, D]`` cut into each case's rows."""
        return [out[self.rows_of(i)] for i in range(len(self.row_starts))]


def launch_pool(
    cases: Sequence[Case], device: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The pool of a launch of packable ``cases`` (uninitialised) and each case's part of it,
    in order: materialise each case into its part (``materialize(case, dev, pool=part)``) and
    the launch's pool is built with no copy (:func:`pack` with ``storage``). On a GPU a
    launch's pools are most of what it writes (up to several GiB): stacking them afterwards
    read and wrote them all again, and held them twice."""
    first = cases[0]
    page_dim = PAGE_DIM[first.pool.kv_storage]
    shape = pool_shape(first, sum(c.num_pages() for c in cases))
    storage = torch.empty(shape, dtype=DTYPES[first.attention.kv_dtype], device=device)
    # each case's pages, or its token slots
    return storage, _cut(storage, page_dim, [pool_shape(c)[page_dim] for c in cases])


def pool_bytes(cases: Sequence[Case]) -> int:
    """The bytes of the pool :func:`launch_pool` allocates for ``cases`` (K and V of each
    case's pool, stacked), without allocating it."""
    return sum(c.pool_elements() * DTYPES[c.attention.kv_dtype].itemsize for c in cases)


def launch_queries(
    cases: Sequence[Case], device: torch.device
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The query rows of a launch of packable ``cases`` (uninitialised) and each case's rows
    of it, padding included (only the last case may pad), in order, as :func:`launch_pool`
    gives the pool: materialise each case into its rows (``materialize(..., queries=part)``)
    and the launch's queries need no copy (:func:`pack` with ``queries``); on a GPU the
    fused stores of all of them are then one launch (:func:`fused_store.deferred`)."""
    shapes = [query_shape(c) for c in cases]
    total = sum(shape[0] for shape in shapes)
    q = torch.empty(
        (total, *shapes[0][1:]), dtype=DTYPES[cases[0].attention.q_dtype], device=device
    )
    return q, _cut(q, 0, [shape[0] for shape in shapes])


def _cut(whole: torch.Tensor, dim: int, extents: Sequence[int]) -> list[torch.Tensor]:
    """``whole`` cut along ``dim`` into consecutive parts of ``extents`` (views, in order:
    what :func:`_parts_of` recognises)."""
    parts, at = [], 0
    for extent in extents:
        parts.append(whole.narrow(dim, at, extent))
        at += extent
    return parts


def pack(
    batches: Sequence[Batch],
    storage: torch.Tensor | None = None,
    queries: torch.Tensor | None = None,
) -> PackedLaunch:
    """Stack the materialised batches of packable cases into one launch's batch. ``storage``:
    the launch's pool, when each batch's pool is its part of it (:func:`launch_pool`), else
    the pools are stacked here; ``queries`` likewise, the launch's query rows
    (:func:`launch_queries`)."""
    cases = [b.case for b in batches]
    spec = packed_case(cases)
    page_dim = PAGE_DIM[spec.pool.kv_storage]
    tables, offset = [], 0
    for b in batches:  # on the host, from each case's plan: the same table, no device wait
        table = placement.page_table(b.case)
        used = np.arange(table.shape[1]) < np.asarray(b.case.pages_per_request()).reshape(-1, 1)
        tables.append(np.where(used, table + offset, table))
        offset += b.kv_cache.shape[0]  # the pages of this case's pool
    if offset >= placement.OUT_OF_RANGE_BASE:  # the out_of_range table fill must stay out of range
        raise ValueError(f"a packed pool of {offset} pages would reach the out-of-range fill")
    block_tables = np.concatenate(tables).astype(np.int32)
    device_tables = host_copy.to_device({"t": block_tables}, batches[-1].device)["t"]
    if storage is None:
        storage = torch.cat([b.kv_storage for b in batches], dim=page_dim)
    elif not _parts_of(storage, [b.kv_storage for b in batches], page_dim):
        raise ValueError("the batches' pools are not the parts of the launch's pool, in order")
    last = batches[-1]
    if queries is None:
        q_padded = torch.cat([b.q for b in batches] + [last.q_padded[last.q.shape[0] :]])
    elif _parts_of(queries, [b.q_padded for b in batches], 0):
        q_padded = queries
    else:
        raise ValueError("the batches' query rows are not the parts of the launch's, in order")
    counts = tuple(c.batch.num_query_rows for c in cases)
    starts = tuple(sum(counts[:i]) for i in range(len(counts)))
    batch = Batch(
        case=spec,
        device=last.device,
        q_padded=q_padded,
        kv_storage=storage,
        kv_cache=hnd_view(spec, storage),
        block_tables=device_tables,
        seq_lens=torch.cat([b.seq_lens for b in batches]),
        sinks=batches[0].sinks,
        draft_mask=batches[0].draft_mask,
    )
    new_tokens = np.asarray(spec.batch.new_tokens(), dtype=np.int64)
    layouts = {"new_tokens": new_tokens, "row_requests": placement.tokens_of(new_tokens)[0]}
    batch.knowing(**host_copy.to_device(layouts, batch.device))
    return PackedLaunch(batch=batch, row_starts=starts, row_counts=counts)


def _parts_of(storage: torch.Tensor, pools: Sequence[torch.Tensor], page_dim: int) -> bool:
    """Whether ``pools`` are ``storage`` cut along ``page_dim`` in order (views of it, each
    starting where the last ended, together all of it)."""
    step = storage.stride(page_dim) * storage.element_size()
    at = storage.data_ptr()
    for part in pools:
        same = part.shape[:page_dim] + part.shape[page_dim + 1 :]
        if (
            part.data_ptr() != at
            or same != storage.shape[:page_dim] + storage.shape[page_dim + 1 :]
        ):
            return False
        at += part.shape[page_dim] * step
    return at == storage.data_ptr() + storage.shape[page_dim] * step
