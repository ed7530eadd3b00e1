"""Case spec -> tensors: build the paged pool, the page table and the queries of a case.

Everything is computed on the target device with the counter-based generator, so the same case
gives bitwise the same tensors on a CPU and on any GPU, with no per-request Python loop.

Each tensor is allocated once, in the layout the case stores it, and filled in passes of about
:data:`CHUNK` elements, which bounds the float64 temporaries (a few MiB on a CPU, more on a
GPU, where each pass is a few kernel launches): live tokens are generated straight into their
slots (K and V in one pass), stale data only into the slots no live token holds, and a token
of a shared prefix only once. On a CUDA device with Triton each role is one kernel call instead
(:mod:`difftest.generation.fused_store`: drawn, finished, rounded and written into its slots,
no float64 buffer; a packed launch's calls run together, :func:`stores_together`), with the
torch form here as its reference (:func:`_store_torch`). Every
value is a pure function of its logical coordinates, so the order of the passes changes no bit,
and the arithmetic after the hash is the same float64 operations in the same order as ever (a
division by a power-of-two scale becomes the multiplication by its inverse: both are exact).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager

import torch

from difftest.generation import fused_store, placement, rng, values
from difftest.generation.rng import Stream
from difftest.machine.device import is_on
from difftest.model.batch import DTYPES, Batch
from difftest.model.case import Case

_FP8_MAX = 448.0

CHUNK = {"cpu": 1 << 18}
"""Elements generated per pass, by device type (others: :data:`CHUNK_DEFAULT`)."""
CHUNK_DEFAULT = 1 << 24


def materialize(
    case: Case,
    device: torch.device | str = "cpu",
    *,
    pool: torch.Tensor | None = None,
    queries: torch.Tensor | None = None,
    plan: placement.DevicePlacement | None = None,
) -> Batch:
    """Build the :class:`Batch` of ``case`` on ``device``. ``pool``: the tensor its K/V pool
    is written into (of :func:`pool_shape` and the case's dtype, on ``device``; any strides,
    as a slice of a packed launch's pool has), else a new one; ``queries`` likewise for its
    query rows, padding included (:func:`query_shape`); ``plan``: the case's plan already on
    ``device`` (``placement.on_device``: a packed launch's plans in one copy), else placed
    here."""
    dev = torch.device(device)
    if plan is None:
        plan = placement.place(case).on(dev)
    kv_storage = _pool(case, plan, dev, pool)
    batch = Batch(
        case=case,
        device=dev,
        q_padded=_queries(case, plan, dev, queries),
        kv_storage=kv_storage,
        kv_cache=hnd_view(case, kv_storage),
        block_tables=plan.block_tables,
        seq_lens=plan.seq_lens,
        sinks=plan.sinks,
        draft_mask=plan.draft_mask,
    )
    return batch.knowing(new_tokens=plan.new_tokens, row_requests=plan.query_req)


def stores_together() -> AbstractContextManager[None]:
    """A block whose cases' fused stores run together when it ends, a launch per destination
    tensor (:func:`fused_store.deferred`): materialise a packed launch's cases into their
    parts of its pool and query rows inside it. Off CUDA it changes nothing."""
    return fused_store.deferred()


def page_table(case: Case, dev: torch.device) -> torch.Tensor:
    """int64 ``[bs, W]`` physical page ids, with the case's fill past each request's pages
    (:func:`placement.page_table`, on ``dev``)."""
    return torch.from_numpy(placement.page_table(case).copy()).to(dev)


def _chunks(n: int, per_item: int, dev: torch.device) -> Iterator[slice]:
    """Slices of ``range(n)`` of about :data:`CHUNK` elements each (``per_item`` per index)."""
    step = max(1, CHUNK.get(dev.type, CHUNK_DEFAULT) // per_item)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _divide_(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x / scale`` in place. Dividing by a power of two is exact, and so is multiplying by
    its inverse (the same real number, correctly rounded): the cheaper multiply, same bits
    (:func:`fused_store.quantiser` says which, for both forms)."""
    mul, div = fused_store.quantiser(scale)
    if mul != 1.0:
        return x.mul_(mul)
    return x.div_(div) if div != 1.0 else x


def _limit(dtype: str) -> float:
    """The largest finite value a pool of ``dtype`` holds (what its values saturate at)."""
    return _FP8_MAX if dtype == "fp8_e4m3" else torch.finfo(DTYPES[dtype]).max


def _store_torch(
    dest: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    columns: tuple[torch.Tensor, ...],
    recipe: values.Recipe,
    heads: int,
    dim: int,
    divisor: float,
    limit: float | None,
) -> None:
    """:func:`fused_store.store` in torch: ``recipe``'s values of the tokens of ``columns``,
    divided by ``divisor``, clamped to ``±limit`` (``None``: not) and converted to ``dest``'s
    dtype, written at ``dest[slots // page_size, slots % page_size]``."""
    x = _divide_(values.recipe_values([recipe], columns, heads, dim)[0], divisor)
    if limit is not None:
        x.clamp_(-limit, limit)
    _bits(dest)[slots // page_size, slots % page_size] = _bits(x.to(dest.dtype))


def _quantize_into(out: torch.Tensor, x: torch.Tensor, scale: float, dtype: str) -> None:
    """Divide by the scale and round, saturating at the dtype's largest finite value (``x`` is
    overwritten).

    A pool only ever holds K/V that a model wrote or an fp8 quantiser saturated: finite. (An
    inf in a stale slot would turn a kernel's correct ``0 * v`` for a masked key into NaN.)
    """
    limit = _limit(dtype)
    out.copy_(_divide_(x, scale).clamp_(-limit, limit))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as the widest integers that tile its last dimension: an index write then
    moves fewer, wider elements (and needs no float8 kernel)."""
    row = t.shape[-1] * t.element_size()
    width = next(w for w in (8, 4, 2, 1) if row % w == 0)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[width])


def pool_shape(case: Case, pages: int | None = None) -> tuple[int, ...]:
    """The shape of ``case``'s K/V pool of ``pages`` pages (``None``: the case's own), in the
    layout the case stores it (pages stacked along :data:`PAGE_DIM`, see :func:`hnd_view`)."""
    a = case.attention
    ps, heads, dim = a.page_size, a.num_kv_heads, a.head_dim
    n = case.num_pages() if pages is None else pages
    return {
        "hnd": (n, 2, heads, ps, dim),
        "nhd": (n, 2, ps, heads, dim),
        "kv_split_nhd": (2, n * ps, heads, dim),  # SGLang: K and V buffers per token
    }[case.pool.kv_storage]


def _fits(
    into: torch.Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    dev: torch.device,
    words: tuple[str, str],
) -> torch.Tensor:
    """``into``, a tensor handed in to be written (a part of a packed launch's), when it has
    the case's ``shape`` and ``dtype`` on ``dev``; else a ``ValueError`` naming both, in
    ``words`` (what it is, what the case's is)."""
    if tuple(into.shape) != shape or into.dtype != dtype or not is_on(into, dev):
        raise ValueError(
            f"{words[0]} {tuple(into.shape)} {into.dtype} on {into.device} for a case whose "
            f"{words[1]} {shape} {dtype} on {dev}"
        )
    return into


def _pool(
    case: Case, plan: placement.DevicePlacement, dev: torch.device, into: torch.Tensor | None
) -> torch.Tensor:
    """The K/V pool in the layout the case stores it (:data:`PAGE_DIM`, :func:`hnd_view`),
    written into ``into`` when given."""
    a, pool = case.attention, case.pool
    ps, heads, dim = a.page_size, a.num_kv_heads, a.head_dim
    shape = pool_shape(case)
    dtype = DTYPES[a.kv_dtype]
    zeros = pool.stale_fill == "zeros"
    if into is None:
        storage = (torch.zeros if zeros else torch.empty)(shape, dtype=dtype, device=dev)
    else:
        _fits(into, shape, dtype, dev, ("a pool of", "pool is"))
        storage = into.zero_() if zeros else into
    by_slot = _bits(hnd_view(case, storage).permute(1, 0, 3, 2, 4))  # [2, pages, ps, H, D]

    def write(slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        out = torch.empty((2, *k.shape), dtype=dtype, device=dev)
        _quantize_into(out[0], k, a.k_scale, a.kv_dtype)
        _quantize_into(out[1], v, a.v_scale, a.kv_dtype)
        by_slot[:, slot // ps, slot % ps] = _bits(out)

    key_req, tok, slot = plan.key_req, plan.token, plan.slot
    recipes = values.kv_recipes(case.values, case.seed, plan.outlier_factor, plan.near_ties_base)
    fused = fused_store.usable(dev)
    if fused:  # each role drawn and stored in place in one kernel (no float64 buffers)
        slots_view = hnd_view(case, storage).permute(1, 0, 3, 2, 4)  # [2, pages, ps, H, D]
        limit, scales = _limit(a.kv_dtype), (a.k_scale, a.v_scale)
        columns = (key_req, tok)
        for role, recipe in enumerate(recipes):
            fused_store.store(
                slots_view[role],
                slot,
                ps,
                columns,
                recipe,
                heads,
                dim,
                scales[role],
                limit,
                _store_torch,
            )
    else:
        for c in _chunks(tok.numel(), 2 * heads * dim, dev):
            part = [r.for_tokens(c) for r in recipes]
            kv = values.recipe_values(part, (key_req[c], tok[c]), heads, dim)
            write(slot[c], *kv)
    if plan.stale is not None:
        ids = plan.stale
        if fused:
            for role, name in enumerate(("k", "v")):
                recipe = values.stale_recipe(pool.stale_fill, case.seed, name)
                fused_store.store(
                    slots_view[role],
                    ids,
                    ps,
                    (ids,),
                    recipe,
                    heads,
                    dim,
                    scales[role],
                    limit,
                    _store_torch,
                )
        else:
            for c in _chunks(ids.numel(), 2 * heads * dim, dev):
                drawn = values.stale_kv_values(pool.stale_fill, case.seed, ids[c], heads, dim)
                write(ids[c], *drawn)
    return storage


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


def query_shape(case: Case) -> tuple[int, int, int]:
    """The shape of ``case``'s query rows, its padding rows after them: ``[R + pad, H_q, D]``."""
    a, b = case.attention, case.batch
    return (b.num_query_rows + b.padding_rows, a.num_qo_heads, a.head_dim)


def _queries(
    case: Case, plan: placement.DevicePlacement, dev: torch.device, into: torch.Tensor | None
) -> torch.Tensor:
    a, b = case.attention, case.batch
    rows, heads, dim = b.num_query_rows, a.num_qo_heads, a.head_dim
    shape, dtype = query_shape(case), DTYPES[a.q_dtype]
    if into is None:
        q = torch.empty(shape, dtype=dtype, device=dev)
    else:
        q = _fits(into, shape, dtype, dev, ("query rows of", "rows are"))
    req, row = plan.query_req, plan.query_row
    if fused_store.usable(dev):  # drawn and stored in place, a row per "slot" of one
        by_row = q.view(q.shape[0], 1, heads, dim)
        recipe = values.query_recipe(case.values, case.seed)
        every = plan.query_slot
        fused_store.store(
            by_row, every[:rows], 1, (req, row), recipe, heads, dim, a.q_scale, None, _store_torch
        )
        if b.padding_rows:
            fused_store.store(
                by_row,
                every[rows:],
                1,
                (plan.pad_row,),
                values.padding_recipe(case.seed),
                heads,
                dim,
                a.q_scale,
                None,
                _store_torch,
            )
        return q
    for c in _chunks(rows, heads * dim, dev):
        x = values.query_values(case.values, case.seed, req[c], row[c], heads, dim)
        q[c].copy_(_divide_(x, a.q_scale))
    if b.padding_rows:
        pad = values.padding_row_values(case.seed, b.padding_rows, heads, dim, dev)
        q[rows:].copy_(_divide_(pad, a.q_scale))
    return q


def stale_buffers(
    case: Case, requests: int, columns: int, pages: int, seed: int, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What earlier batches left in a CUDA graph's static buffers, for ``case``'s
    configuration: ``(q, table, storage)``.

    ``q`` ``[requests * L, H_q, D]`` holds their query rows, ``table`` int32
    ``[requests, columns]`` their page ids (in ``[0, pages)``: pages of the pool), ``storage``
    the pool of ``pages`` pages in the case's storage layout, every slot holding their K/V. All
    are functions of ``seed`` (and the shapes) only.
    """
    a = case.attention
    L, heads, dim, ps = case.batch.q_len, a.num_qo_heads, a.head_dim, a.page_size
    rows = requests * L
    q = torch.empty((rows, heads, dim), dtype=DTYPES[a.q_dtype], device=dev)
    key = rng.key(seed, Stream.GRAPH_QUERY)
    for c in _chunks(rows, heads * dim, dev):
        q[c].copy_(rng.token_normals([key], (rng.arange(rows, dev)[c],), heads, dim)[0])
    cells = rng.hash_coords(
        rng.keyed(seed, Stream.GRAPH_TABLE, dev),
        rng.arange(requests, dev).view(-1, 1),
        rng.arange(columns, dev).view(1, -1),
    )
    table = torch.remainder(cells, max(pages, 1)).to(torch.int32)
    shape = {
        "hnd": (pages, 2, a.num_kv_heads, ps, dim),
        "nhd": (pages, 2, ps, a.num_kv_heads, dim),
        "kv_split_nhd": (2, pages * ps, a.num_kv_heads, dim),
    }[case.pool.kv_storage]
    dtype = DTYPES[a.kv_dtype]
    storage = torch.empty(shape, dtype=dtype, device=dev)
    by_slot = _bits(hnd_view(case, storage).permute(1, 0, 3, 2, 4))  # [2, pages, ps, H, D]
    slots = rng.arange(pages * ps, dev)
    for c in _chunks(slots.numel(), 2 * a.num_kv_heads * dim, dev):
        k, v = values.stale_kv_values("randn", seed, slots[c], a.num_kv_heads, dim)
        out = torch.empty((2, *k.shape), dtype=dtype, device=dev)
        _quantize_into(out[0], k, 1.0, a.kv_dtype)
        _quantize_into(out[1], v, 1.0, a.kv_dtype)
        by_slot[:, slots[c] // ps, slots[c] % ps] = _bits(out)
    return q, table, storage
