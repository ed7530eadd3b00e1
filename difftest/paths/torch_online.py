"""``torch-paged-online``: a kernel-shaped implementation in plain PyTorch.

Walks the page table a tile at a time, like a paged attention kernel walks its KV tiles (a tile
is the page columns holding :data:`TILE_TOKENS` keys, one column when pages are that large or
larger; a long sequence is cut into at most :data:`MAX_TILES` tiles, as split-KV kernels cut it
into a bounded number of chunks), and merges tiles with the online (streaming) softmax: running
maximum, rescaled denominator and accumulator in float32, probabilities rounded to the query
dtype before ``P @ V`` as flash-style kernels do. It shares no code with the oracle and takes a
different route to the same numbers (no gather of whole sequences, no full score matrix), so on
a CPU the differential loop compares two independent formulations. Vectorised over requests and
heads (the query heads of one KV head are one block of rows of each product, so no K/V head is
repeated); the only loop is over tiles (the masks and page ids of every tile are computed once,
before it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from difftest.model.batch import DTYPES, Batch
from difftest.paths.modes import PathModes, accepts
from difftest.paths.registry import KernelPath, Precision, compiles_nothing, register


@dataclass(frozen=True, slots=True)
class OnlineInputs:
    """What the streaming loop reads, unpacked from a batch (``R = bs * L`` query rows)."""

    q: torch.Tensor  # [bs, H_q, L, D] float32
    k_pages: torch.Tensor  # [P, H_kv, ps, D] as stored
    v_pages: torch.Tensor
    table: torch.Tensor  # [bs, W] int64
    seq_lens: torch.Tensor  # [bs] int64, prefix + L
    draft_mask: torch.Tensor  # [L, L] bool, or [bs, L, L] (ragged requests, in the frame)
    sinks: torch.Tensor | None  # [H_q] float32
    bmm1_scale: float
    bmm2_scale: float
    window_left: int
    group_size: int
    p_dtype: torch.dtype


def unpack(batch: Batch) -> OnlineInputs:
    a = batch.case.attention
    bs, L = batch.batch_size, batch.q_len
    # Contiguous once: every tile's Q @ K^T would copy a transposed q to contiguous again.
    q = batch.frame_queries().view(bs, L, a.num_qo_heads, a.head_dim).transpose(1, 2)
    return OnlineInputs(
        q=q.contiguous(),
        k_pages=batch.k_pages,
        v_pages=batch.v_pages,
        table=batch.block_tables.long(),
        seq_lens=batch.seq_lens.long(),
        draft_mask=batch.frame_draft_mask() if batch.is_ragged else batch.draft_mask,
        sinks=None if batch.sinks is None else batch.sinks.float(),
        bmm1_scale=batch.bmm1_scale,
        bmm2_scale=batch.bmm2_scale,
        window_left=batch.window_left,
        group_size=a.group_size,
        p_dtype=DTYPES[a.q_dtype],
    )


TILE_TOKENS = 64
"""Keys one step of the streaming loop takes, at least (whole page columns)."""
MAX_TILES = 16
"""Steps the streaming loop takes over a range of page columns, at most."""


def tiles(columns: range, page_size: int) -> list[range]:
    """``columns`` cut into consecutive tiles: at least ``TILE_TOKENS // page_size`` columns
    each (one when pages are larger), and at most :data:`MAX_TILES` tiles."""
    step = max(1, TILE_TOKENS // page_size, -(-len(columns) // MAX_TILES))
    return [range(c, min(c + step, columns.stop)) for c in range(columns.start, columns.stop, step)]


def tile_visibility(x: OnlineInputs, keys: torch.Tensor) -> torch.Tensor:
    """``[bs, 1, L, n]``: which of the key positions ``keys`` (``[n]``) each query row may see."""
    bs, _, L, _ = x.q.shape
    dev = x.q.device
    key = keys.view(1, 1, -1)
    seq = x.seq_lens.view(bs, 1, 1)
    pos = seq - L + torch.arange(L, device=dev).view(1, L, 1)
    visible = key <= pos
    if x.window_left >= 0:
        visible &= key >= pos - x.window_left
    draft = key - (seq - L)
    row = torch.arange(L, device=dev).view(1, L, 1)
    if x.draft_mask.dim() == 3:  # one mask per request
        req = torch.arange(bs, device=dev).view(bs, 1, 1)
        allowed = x.draft_mask[req, row, draft.clamp(0, L - 1)]
    else:
        allowed = x.draft_mask[row, draft.clamp(0, L - 1)]
    visible &= (draft < 0) | allowed
    return visible.unsqueeze(1)


def tile_pages(pages: torch.Tensor, page: torch.Tensor) -> torch.Tensor:
    """The pages ``page`` (``[bs, c]`` ids) of ``pages`` (``[P, H_kv, ps, D]``) as one tile per
    request: ``[bs, H_kv, c * ps, D]`` float32, keys in order."""
    bs, c = page.shape
    _, h_kv, ps, dim = pages.shape
    tile = torch.empty((bs, h_kv, c, ps, dim), dtype=torch.float32, device=pages.device)
    tile.copy_(pages[page].permute(0, 2, 1, 3, 4))  # reordered and upcast in one copy
    return tile.view(bs, h_kv, c * ps, dim)


def tile_live(x: OnlineInputs, cols: range, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(page ids [bs, c], live keys [bs, 1, 1, c * ps])`` of tile ``cols``: a column past a
    request's used pages reads page 0 (never the table's fill) and none of its keys count."""
    bs = x.q.shape[0]
    dev = x.q.device
    used = (x.seq_lens + page_size - 1) // page_size
    col = torch.arange(cols.start, cols.stop, device=dev)
    live = col.view(1, -1) < used.view(-1, 1)  # [bs, c]: requests with a page in the column
    page = torch.where(live, x.table[:, cols.start : cols.stop], 0)
    keys = live.repeat_interleave(page_size, dim=1)
    return page, keys.view(bs, 1, 1, -1)


def stream(x: OnlineInputs, page_size: int) -> torch.Tensor:
    """Online-softmax attention over the page table; returns ``[bs, H_q, L, D]`` float32."""
    bs, hq, L, dim = x.q.shape
    dev = x.q.device
    m = torch.full((bs, hq, L, 1), float("-inf"), device=dev)
    denom = torch.zeros((bs, hq, L, 1), device=dev)
    acc = torch.zeros((bs, hq, L, dim), device=dev)
    pages_used = (x.seq_lens + page_size - 1) // page_size
    every = range(int(pages_used.max()))
    # Which keys each row sees and which page each column reads, for every used column at
    # once; a tile takes its slice (the same masks tile_live and tile_visibility give it).
    page_all, live_all = tile_live(x, every, page_size)
    hidden_all = ~(tile_visibility(x, torch.arange(len(every) * page_size, device=dev)) & live_all)
    # The query heads of one KV head as one block of rows (head h = kv * group + j reads KV
    # head kv): Q @ K^T and P @ V are products per KV head, and no K/V head is repeated.
    h_kv = hq // x.group_size
    q = x.q.view(bs, h_kv, x.group_size * L, dim)
    for cols in tiles(every, page_size):
        page = page_all[:, cols.start : cols.stop]
        hidden = hidden_all[..., cols.start * page_size : cols.stop * page_size]
        k = tile_pages(x.k_pages, page)  # [bs,H_kv,n,D]
        v = tile_pages(x.v_pages, page)
        n = k.shape[2]
        s = (torch.matmul(q, k.transpose(-1, -2)) * x.bmm1_scale).view(bs, hq, L, n)
        s = s.masked_fill(hidden, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # rows with nothing seen yet
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe)
        denom = denom * alpha + p.sum(dim=-1, keepdim=True)
        pv = torch.matmul(p.to(x.p_dtype).float().view(bs, h_kv, x.group_size * L, n), v)
        acc = acc * alpha + pv.view(bs, hq, L, dim)
        m = m_new
    if x.sinks is not None:
        sink = x.sinks.view(1, hq, 1, 1)
        m_new = torch.maximum(m, sink)
        alpha = torch.exp(m - m_new)
        denom = denom * alpha + torch.exp(sink - m_new)
        acc = acc * alpha
    out = torch.where(denom > 0, acc / denom.clamp_min(1e-30), 0.0)  # empty rows give 0
    return out * x.bmm2_scale


def run(batch: Batch) -> torch.Tensor:
    out = stream(unpack(batch), batch.case.attention.page_size)  # [bs, H_q, L, D]
    return batch.output_from_frame(out.transpose(1, 2))


register(
    KernelPath(
        name="torch-paged-online",
        run=run,
        side="reference",
        build_key=compiles_nothing,
        modes=PathModes(ragged=accepts),
        precision=lambda case: Precision(p_dtype=case.attention.q_dtype),
        description="page-by-page online softmax in PyTorch, float32, P in the query dtype",
    )
)
