"""``torch-paged-online``: a kernel-shaped implementation in plain PyTorch.

Walks the page table one column at a time, like a paged attention kernel walks its KV tiles,
and merges tiles with the online (streaming) softmax: running maximum, rescaled denominator and
accumulator in float32, probabilities rounded to the query dtype before ``P @ V`` as
flash-style kernels do. It shares no code with the oracle and takes a different route to the
same numbers (no gather, no full score matrix), so on a CPU the differential loop compares two
independent formulations. Vectorised over requests and heads; the only loop is over page
columns.
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
    q = batch.frame_queries().view(bs, L, a.num_qo_heads, a.head_dim).transpose(1, 2)
    return OnlineInputs(
        q=q,
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


def tile_visibility(x: OnlineInputs, col: int, page_size: int) -> torch.Tensor:
    """``[bs, 1, L, ps]``: which keys of page column ``col`` each query row may see."""
    bs, _, L, _ = x.q.shape
    dev = x.q.device
    key = col * page_size + torch.arange(page_size, device=dev).view(1, 1, -1)
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


def stream(x: OnlineInputs, page_size: int) -> torch.Tensor:
    """Online-softmax attention over the page table; returns ``[bs, H_q, L, D]`` float32."""
    bs, hq, L, dim = x.q.shape
    dev = x.q.device
    m = torch.full((bs, hq, L, 1), float("-inf"), device=dev)
    denom = torch.zeros((bs, hq, L, 1), device=dev)
    acc = torch.zeros((bs, hq, L, dim), device=dev)
    pages_used = (x.seq_lens + page_size - 1) // page_size
    for col in range(int(pages_used.max())):
        live = col < pages_used  # requests that still have a page in this column
        page = torch.where(live, x.table[:, col], 0)
        k = x.k_pages[page].float().repeat_interleave(x.group_size, dim=1)  # [bs,H_q,ps,D]
        v = x.v_pages[page].float().repeat_interleave(x.group_size, dim=1)
        s = torch.matmul(x.q, k.transpose(-1, -2)) * x.bmm1_scale  # [bs,H_q,L,ps]
        visible = tile_visibility(x, col, page_size) & live.view(bs, 1, 1, 1)
        s = s.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # rows with nothing seen yet
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe)
        denom = denom * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + torch.matmul(p.to(x.p_dtype).float(), v)
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
