"""The kernel the mutants are made from: ``torch-paged-online``'s streaming loop with its seams
exposed.

:func:`difftest.paths.torch_online.stream` walks the page table tile by tile (a few page
columns each) and merges tiles with the online softmax. A mutant changes one thing: its inputs
(:class:`~difftest.paths.torch_online.OnlineInputs`), which keys a tile may see, how query
heads map to KV heads, which page columns one pass walks (split-KV), how partial passes are merged,
or where the output rows go. :func:`attend` with no seam changed computes what ``stream`` does
(a unit test holds it to that), so any difference a mutant shows is its injected bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from difftest.model.batch import Batch
from difftest.paths.torch_online import (
    OnlineInputs,
    tile_live,
    tile_pages,
    tile_visibility,
    tiles,
)

Visibility = Callable[[OnlineInputs, torch.Tensor], torch.Tensor]
"""``(inputs, keys [n]) -> [bs, 1, L, n]`` bool: which of the key positions each row sees."""
HeadMap = Callable[[torch.Tensor, int], torch.Tensor]
"""``(keys [bs, H_kv, n, D], group) -> [bs, H_q, n, D]``: the KV head each query head reads."""


@dataclass(frozen=True, slots=True)
class Partial:
    """Online-softmax state after some columns: running max, denominator and accumulator."""

    m: torch.Tensor  # [bs, H_q, L, 1] float32, -inf where nothing was seen
    denom: torch.Tensor  # [bs, H_q, L, 1]
    acc: torch.Tensor  # [bs, H_q, L, D]


def pages_used(x: OnlineInputs, page_size: int) -> torch.Tensor:
    """``[bs]`` page columns each request occupies."""
    return (x.seq_lens + page_size - 1) // page_size


def partial(
    x: OnlineInputs,
    page_size: int,
    columns: range | None = None,
    *,
    visibility: Visibility = tile_visibility,
    heads: HeadMap | None = None,
) -> Partial:
    """Stream the given page columns (default: every used one), tile by tile as
    :func:`~difftest.paths.torch_online.stream` does, into an online-softmax state.

    ``heads``: ``None``, the right GQA mapping as ``stream`` computes it (a KV head's query
    heads are one block of rows of each product); a :data:`HeadMap`, K/V repeated for the
    query heads as it maps them."""
    bs, hq, L, dim = x.q.shape
    h_kv = hq // x.group_size
    dev = x.q.device
    m = torch.full((bs, hq, L, 1), float("-inf"), device=dev)
    denom = torch.zeros((bs, hq, L, 1), device=dev)
    acc = torch.zeros((bs, hq, L, dim), device=dev)
    used = pages_used(x, page_size)
    if columns is None:
        columns = range(int(used.max()))
    for cols in tiles(columns, page_size):
        page, live = tile_live(x, cols, page_size)
        k, v = tile_pages(x.k_pages, page), tile_pages(x.v_pages, page)  # [bs, H_kv, n, D]
        n = k.shape[2]
        if heads is None:
            q = x.q.view(bs, h_kv, x.group_size * L, dim)
            s = (torch.matmul(q, k.transpose(-1, -2)) * x.bmm1_scale).view(bs, hq, L, n)
        else:
            k, v = heads(k, x.group_size), heads(v, x.group_size)
            s = torch.matmul(x.q, k.transpose(-1, -2)) * x.bmm1_scale
        keys = torch.arange(cols.start * page_size, cols.stop * page_size, device=dev)
        visible = visibility(x, keys) & live
        s = s.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe)
        denom = denom * alpha + p.sum(dim=-1, keepdim=True)
        p = p.to(x.p_dtype).float()
        if heads is None:
            pv = torch.matmul(p.view(bs, h_kv, x.group_size * L, n), v).view(bs, hq, L, dim)
        else:
            pv = torch.matmul(p, v)
        acc = acc * alpha + pv
        m = m_new
    return Partial(m=m, denom=denom, acc=acc)


def merge(parts: Iterable[Partial]) -> Partial:
    """Merge partial states of disjoint column ranges (the split-KV reduction, done right)."""
    items = list(parts)
    m = items[0].m
    for p in items[1:]:
        m = torch.maximum(m, p.m)
    safe = torch.where(torch.isinf(m), 0.0, m)
    denom = torch.zeros_like(items[0].denom)
    acc = torch.zeros_like(items[0].acc)
    for p in items:
        w = torch.exp(p.m - safe)
        denom = denom + p.denom * w
        acc = acc + p.acc * w
    return Partial(m=m, denom=denom, acc=acc)


def with_sinks(x: OnlineInputs, state: Partial) -> Partial:
    """Fold the sinks into the denominator (one extra key with a zero value per query head)."""
    if x.sinks is None:
        return state
    sink = x.sinks.view(1, -1, 1, 1)
    m_new = torch.maximum(state.m, sink)
    alpha = torch.exp(state.m - m_new)
    return Partial(
        m=m_new,
        denom=state.denom * alpha + torch.exp(sink - m_new),
        acc=state.acc * alpha,
    )


def finish(x: OnlineInputs, state: Partial) -> torch.Tensor:
    """``[bs, H_q, L, D]`` float32 output of a complete state (sinks, normalise, ``bmm2``)."""
    state = with_sinks(x, state)
    out = torch.where(state.denom > 0, state.acc / state.denom.clamp_min(1e-30), 0.0)
    return out * x.bmm2_scale


def attend(
    x: OnlineInputs,
    page_size: int,
    *,
    visibility: Visibility = tile_visibility,
    heads: HeadMap | None = None,
) -> torch.Tensor:
    """The whole attention in one pass: ``[bs, H_q, L, D]`` float32."""
    return finish(x, partial(x, page_size, visibility=visibility, heads=heads))


def emit(batch: Batch, out: torch.Tensor) -> torch.Tensor:
    """``[bs, H_q, L, D]`` -> the path's output ``[R, H_q, D]`` in the case's output dtype."""
    a = batch.case.attention
    result = batch.new_output()
    result.copy_(out.transpose(1, 2).reshape(-1, a.num_qo_heads, a.head_dim))
    return result
