"""Case spec -> tensors: build the paged pool, the page table and the queries of a case.

Everything is computed on the target device with the counter-based generator, so the same case
gives bitwise the same tensors on a CPU and on any GPU, with no per-request Python loop.
"""

from __future__ import annotations

import torch

from difftest.generation import rng, values
from difftest.generation.rng import Stream
from difftest.model.batch import DTYPES, Batch
from difftest.model.case import Case, draft_mask_rows

_FP8_MAX = 448.0
OUT_OF_RANGE_BASE = 1 << 24
"""Table fill for ``out_of_range``: far past any pool, so a read of it faults at once."""


def materialize(case: Case, device: torch.device | str = "cpu") -> Batch:
    """Build the :class:`Batch` of ``case`` on ``device``."""
    dev = torch.device(device)
    a, b = case.attention, case.batch
    seq_lens = torch.tensor(b.seq_lens(), dtype=torch.int64, device=dev)
    physical = page_table(case, dev)
    k_slots, v_slots = _pool(case, physical, seq_lens, dev)
    kv_storage, kv_cache = _layout(case, k_slots, v_slots)
    q_padded = _queries(case, dev)
    sinks = None
    if a.sinks:
        sinks = values.sink_values(case.values, case.seed, a.num_qo_heads, dev).float()
    mask = torch.tensor(draft_mask_rows(b.draft, b.q_len), dtype=torch.bool, device=dev)
    return Batch(
        case=case,
        device=dev,
        q_padded=q_padded,
        kv_storage=kv_storage,
        kv_cache=kv_cache,
        block_tables=physical.to(torch.int32),
        seq_lens=seq_lens.to(torch.int32),
        sinks=sinks,
        draft_mask=mask,
    )


def page_permutation(case: Case, dev: torch.device) -> torch.Tensor:
    """Physical page id of each logical page (logical pages are numbered in request order)."""
    n = case.num_pages()
    ids = rng.arange(n, dev)
    order = case.pool.page_order
    if order == "sequential":
        return ids
    if order == "reversed":
        return ids.flip(0)
    # Sorting distinct 64-bit hashes is deterministic on every device.
    return torch.argsort(rng.hash_coords(rng.keyed(case.seed, Stream.PAGE_ORDER, dev), ids))


def page_table(case: Case, dev: torch.device) -> torch.Tensor:
    """int64 ``[bs, W]`` physical page ids, with the case's fill past each request's pages."""
    b, pool = case.batch, case.pool
    bs, width = b.num_requests, case.table_width()
    shared = pool.shared_prefix_pages
    pages = torch.tensor(case.pages_per_request(), dtype=torch.int64, device=dev)
    is_real = rng.arange(bs, dev) < len(b.prefix_lens)
    shared_b = torch.where(is_real, shared, 0)
    own = pages - shared_b
    first_own = shared + torch.cumsum(own, 0) - own  # logical id of each request's first own page
    col = rng.arange(width, dev).view(1, -1)
    logical = torch.where(
        col < shared_b.view(-1, 1), col, first_own.view(-1, 1) + col - shared_b.view(-1, 1)
    )
    used = col < pages.view(-1, 1)
    perm = page_permutation(case, dev)
    physical = perm[torch.where(used, logical, 0)]
    fill = pool.table_fill
    if fill == "zero":
        filler = torch.zeros_like(physical)
    elif fill == "stale_pages":
        h = rng.hash_coords(
            rng.keyed(case.seed, Stream.STALE_PAGES, dev), rng.arange(bs, dev).view(-1, 1), col
        )
        filler = torch.remainder(h, case.num_pages())
    else:
        filler = OUT_OF_RANGE_BASE + col.expand(bs, width)
    return torch.where(used, physical, filler)


def _live_tokens(seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(req, tok)`` of every live token, request-major."""
    dev = seq_lens.device
    req = torch.repeat_interleave(rng.arange(seq_lens.numel(), dev), seq_lens)
    starts = torch.cumsum(seq_lens, 0) - seq_lens
    tok = rng.arange(req.numel(), dev) - starts[req]
    return req, tok


def _quantize(x: torch.Tensor, scale: float, dtype: str) -> torch.Tensor:
    """Divide by the scale and round, saturating at the dtype's largest finite value.

    A pool only ever holds K/V that a model wrote or an fp8 quantiser saturated: finite. (An
    inf in a stale slot would turn a kernel's correct ``0 * v`` for a masked key into NaN.)
    """
    target = DTYPES[dtype]
    limit = _FP8_MAX if dtype == "fp8_e4m3" else torch.finfo(target).max
    return (x / scale).clamp(-limit, limit).to(target)


def _pool(
    case: Case, table: torch.Tensor, seq_lens: torch.Tensor, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V pools as ``[num_pages * page_size, H_kv, D]`` in the stored dtype."""
    a, pool = case.attention, case.pool
    ps, heads, dim = a.page_size, a.num_kv_heads, a.head_dim
    slots = case.num_pages() * ps
    req, tok = _live_tokens(seq_lens)
    slot = table[req, tok // ps] * ps + tok % ps
    shared_tokens = pool.shared_prefix_pages * ps
    in_shared = (tok < shared_tokens) & (req < len(case.batch.prefix_lens))
    key_req = torch.where(in_shared, -1, req)
    out = []
    for role, scale in (("k", a.k_scale), ("v", a.v_scale)):
        buf = values.stale_values(pool.stale_fill, case.seed, role, slots, heads, dim, dev)
        live = values.token_values(case.values, case.seed, role, key_req, tok, heads, dim)
        buf[slot] = live
        out.append(_quantize(buf, scale, a.kv_dtype))
    return out[0], out[1]


def _layout(case: Case, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(storage, kv_cache)``: the pool as the case stores it, and its HND view."""
    a = case.attention
    shape = (case.num_pages(), a.page_size, a.num_kv_heads, a.head_dim)
    storage_kind = case.pool.kv_storage
    if storage_kind == "hnd":
        storage = torch.stack(
            [k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)], dim=1
        ).contiguous()
    elif storage_kind == "nhd":
        storage = torch.stack([k.view(shape), v.view(shape)], dim=1).contiguous()
    else:
        storage = torch.stack([k, v], dim=0).contiguous()  # SGLang: K and V buffers per token
    return storage, hnd_view(case, storage)


PAGE_DIM: dict[str, int] = {"hnd": 0, "nhd": 0, "kv_split_nhd": 1}
"""The dimension of each storage kind along which pages (or token slots) are stacked."""


def hnd_view(case: Case, storage: torch.Tensor) -> torch.Tensor:
    """The ``[pages, 2, H_kv, page_size, D]`` view of a pool stored as ``case`` says (the pool
    may hold more pages than the case uses: the page count is read from ``storage``)."""
    kind = case.pool.kv_storage
    if kind == "hnd":
        return storage
    if kind == "nhd":
        return storage.transpose(2, 3)
    a = case.attention
    pages = storage.shape[1] // a.page_size
    shape = (pages, a.page_size, a.num_kv_heads, a.head_dim)
    return storage.view(2, *shape).permute(1, 0, 3, 2, 4)


def _queries(case: Case, dev: torch.device) -> torch.Tensor:
    a, b = case.attention, case.batch
    rows = b.num_query_rows
    req = torch.div(rng.arange(rows, dev), b.q_len, rounding_mode="floor")
    row = torch.remainder(rng.arange(rows, dev), b.q_len)
    q = values.query_values(case.values, case.seed, req, row, a.num_qo_heads, a.head_dim)
    if b.padding_rows:
        pad = values.padding_row_values(case.seed, b.padding_rows, a.num_qo_heads, a.head_dim, dev)
        q = torch.cat([q, pad])
    return (q / a.q_scale).to(DTYPES[a.q_dtype])
