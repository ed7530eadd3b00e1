"""Tiny paged-KV caches built by hand for the oracle's tests (shares no code with the oracle).

Each request's K and V are given contiguously as ``[T_b, H_kv, D]``; :func:`paginate` scatters
them token by token into a pool of pages in a chosen (or random) physical order, fills every
slot no request owns with stale values, and fills block-table columns past a request's used
pages with garbage ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from difftest.oracle.attention import paged_attention_reference

GARBAGE_IDS = (2**30, -1, 2**31 - 1, -(2**31), 7_777_777)


@dataclasses.dataclass
class Paged:
    """What the oracle takes, plus the contiguous truth it was built from."""

    k_pages: torch.Tensor  # [num_pages, H_kv, page_size, D] (possibly a permuted view)
    v_pages: torch.Tensor
    block_tables: torch.Tensor  # [bs, W] int32
    seq_lens: torch.Tensor  # [bs] int32
    page_of: list[list[int]]  # page_of[b][c] = physical page of column c of request b


def paginate(
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    page_size: int,
    *,
    page_order: list[int] | None = None,
    extra_pages: int = 2,
    extra_columns: int = 2,
    stale: float = 1e3,
    stale_seed: int = 12345,
    garbage_seed: int = 0,
    nhd_view: bool = False,
    dtype: torch.dtype | None = None,
) -> Paged:
    """Scatter per-request contiguous K/V ``[T_b, H_kv, D]`` into a paged pool.

    ``page_order`` is the physical page handed out for each logical page (requests in order);
    default: a seeded random permutation. Unused slots hold ``stale * randn`` values.
    """
    h_kv, d = ks[0].shape[1], ks[0].shape[2]
    used = [-(-k.shape[0] // page_size) for k in ks]
    num_pages = sum(used) + extra_pages
    if page_order is None:
        gen = torch.Generator().manual_seed(stale_seed + 1)
        page_order = torch.randperm(num_pages, generator=gen).tolist()
    gen = torch.Generator().manual_seed(stale_seed)
    shape = (num_pages, page_size, h_kv, d)  # NHD storage, like SGLang's per-token pools
    k_store = stale * torch.randn(shape, generator=gen, dtype=torch.float64)
    v_store = stale * torch.randn(shape, generator=gen, dtype=torch.float64)
    width = max(used) + extra_columns
    table = torch.zeros(len(ks), width, dtype=torch.int64)
    page_of: list[list[int]] = []
    next_page = 0
    for b, (k, v) in enumerate(zip(ks, vs, strict=True)):
        pages = page_order[next_page : next_page + used[b]]
        next_page += used[b]
        page_of.append(pages)
        for c in range(width):
            if c < len(pages):
                table[b, c] = pages[c]
            else:
                table[b, c] = GARBAGE_IDS[(b + c + garbage_seed) % len(GARBAGE_IDS)]
        for t in range(k.shape[0]):
            k_store[pages[t // page_size], t % page_size] = k[t]
            v_store[pages[t // page_size], t % page_size] = v[t]
    if dtype is not None:
        k_store, v_store = k_store.to(dtype), v_store.to(dtype)
    if nhd_view:
        k_pages, v_pages = k_store.permute(0, 2, 1, 3), v_store.permute(0, 2, 1, 3)
    else:
        k_pages = k_store.permute(0, 2, 1, 3).contiguous()
        v_pages = v_store.permute(0, 2, 1, 3).contiguous()
    seq_lens = torch.tensor([k.shape[0] for k in ks], dtype=torch.int32)
    return Paged(k_pages, v_pages, table.to(torch.int32), seq_lens, page_of)


@dataclasses.dataclass
class Case:
    """A random small batch, contiguous per request, plus the oracle's keyword arguments."""

    ks: list[torch.Tensor]  # [T_b, H_kv, D] each
    vs: list[torch.Tensor]
    q: torch.Tensor  # [bs * L, H_q, D]
    q_len: int
    page_size: int
    window_left: int
    sinks: torch.Tensor | None  # [H_q]
    draft_mask: torch.Tensor | None  # [L, L] or [bs, L, L]
    bmm1_scale: float
    bmm2_scale: float


def random_tree(q_len: int, gen: torch.Generator) -> torch.Tensor:
    """A random draft tree over ``q_len`` rows: row ``i`` sees itself and its ancestors."""
    mask = torch.zeros(q_len, q_len, dtype=torch.bool)
    for i in range(q_len):
        mask[i, i] = True
        if i > 0:
            parent = int(torch.randint(-1, i, (), generator=gen))
            if parent >= 0:
                mask[i] |= mask[parent]
    return mask


def random_case(seed: int, kv_dtype: torch.dtype = torch.float64) -> Case:
    """bs 1-3, L 1-5, page size 1-8, 1-4 pages (more if L needs it), GQA group 1/2/4.

    Window, sinks and tree masks are each on or off by the seed. K/V are rounded through
    ``kv_dtype`` so that the contiguous truth equals what the pages hold.
    """
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=gen))

    bs, q_len, page_size = draw(1, 3), draw(1, 5), draw(1, 8)
    h_kv, group, dim = draw(1, 2), (1, 2, 4)[draw(0, 2)], draw(1, 8)
    h_q = h_kv * group
    lengths = [max(q_len, draw(1, draw(1, 4) * page_size)) for _ in range(bs)]
    scale = 0.125 if kv_dtype == torch.float8_e4m3fn else 1.0

    def kv(n: int) -> torch.Tensor:
        x = torch.randn(n, h_kv, dim, generator=gen, dtype=torch.float64)
        return (x / scale).to(kv_dtype).to(torch.float64)

    ks = [kv(n) for n in lengths]
    vs = [kv(n) for n in lengths]
    q = torch.randn(bs * q_len, h_q, dim, generator=gen, dtype=torch.float64)
    window = draw(0, max(lengths)) if draw(0, 1) else -1
    sinks = torch.randn(h_q, generator=gen) * 2 if draw(0, 1) else None
    mask_kind = draw(0, 2)
    mask = None
    if mask_kind == 1:
        mask = random_tree(q_len, gen)
    elif mask_kind == 2:
        mask = torch.stack([random_tree(q_len, gen) for _ in range(bs)])
    return Case(
        ks,
        vs,
        q,
        q_len,
        page_size,
        window,
        sinks,
        mask,
        bmm1_scale=dim**-0.5 * scale,
        bmm2_scale=scale * (0.5 + draw(0, 2)),
    )


def oracle(case: Case, kv_dtype: torch.dtype = torch.float64, **paged_kw: Any) -> torch.Tensor:
    """The oracle under test on ``case``, paged by :func:`paginate` with ``paged_kw``."""
    p = paginate(case.ks, case.vs, case.page_size, dtype=kv_dtype, **paged_kw)
    return paged_attention_reference(
        case.q,
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        case.q_len,
        bmm1_scale=case.bmm1_scale,
        bmm2_scale=case.bmm2_scale,
        window_left=case.window_left,
        sinks=case.sinks,
        draft_mask=case.draft_mask,
    )


@dataclasses.dataclass
class Ragged:
    """A launch whose requests have their own query lengths, and each request alone."""

    paged: Paged
    q: torch.Tensor  # [sum L_b, H_q, D] float64
    q_lens: list[int]
    draft: torch.Tensor  # [bs, L_max, L_max] bool, each request's mask padded
    masks: list[torch.Tensor]  # each request's own [L_b, L_b] mask
    kwargs: dict[str, Any]  # bmm1_scale, bmm2_scale, window_left, sinks

    def alone(self, b: int) -> torch.Tensor:
        """The definition run on request ``b`` alone (its own ``L``)."""
        start = sum(self.q_lens[:b])
        n = self.q_lens[b]
        return paged_attention_reference(
            self.q[start : start + n],
            self.paged.k_pages,
            self.paged.v_pages,
            self.paged.block_tables[b : b + 1],
            self.paged.seq_lens[b : b + 1],
            n,
            draft_mask=self.masks[b][:n, :n],
            **self.kwargs,
        )


def ragged_launch(seed: int, tree: bool | None = None) -> Ragged:
    """A random ragged launch: 1-4 requests of 1-6 new tokens each, chain or tree drafts
    (``tree``: ``None`` draws it), the window, sinks and scales of :func:`random_case`."""
    gen = torch.Generator().manual_seed(1000 + seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=gen))

    base = random_case(seed)
    bs = draw(1, 4)
    h_kv, dim = base.ks[0].shape[1], base.ks[0].shape[2]
    h_q = base.q.shape[1]
    q_lens = [draw(1, 6) for _ in range(bs)]
    lengths = [q + draw(0, 3 * base.page_size) for q in q_lens]
    ks = [torch.randn(n, h_kv, dim, generator=gen, dtype=torch.float64) for n in lengths]
    vs = [torch.randn(n, h_kv, dim, generator=gen, dtype=torch.float64) for n in lengths]
    q = torch.randn(sum(q_lens), h_q, dim, generator=gen, dtype=torch.float64)
    l_max = max(q_lens)
    if tree is None:
        tree = bool(draw(0, 1))
    masks = []
    for n in q_lens:
        m = random_tree(n, gen) if tree else torch.ones(n, n, dtype=torch.bool).tril()
        full = torch.zeros(l_max, l_max, dtype=torch.bool)
        full[:n, :n] = m
        masks.append(full)
    kwargs = {
        "bmm1_scale": base.bmm1_scale,
        "bmm2_scale": base.bmm2_scale,
        "window_left": base.window_left,
        "sinks": base.sinks,
    }
    paged = paginate(ks, vs, base.page_size)
    return Ragged(paged, q, q_lens, torch.stack(masks), masks, kwargs)
