"""``torch-sdpa``: PyTorch's ``scaled_dot_product_attention`` over the gathered paged cache.

An implementation independent of the oracle, so the differential loop has two sides on a CPU
too. It gathers each request's keys through the page table, builds the visibility as an
additive float mask, and folds sinks in as one extra all-zero key whose logit is the sink
(added through the same mask): exactly "one more key with a zero value vector". Grouped-query
heads go to SDPA as they are (``enable_gqa``). Computes in float32 and rounds to the case's
output dtype.
"""

from __future__ import annotations

import torch

from difftest.model.batch import Batch
from difftest.paths.modes import PathModes, accepts
from difftest.paths.registry import KernelPath, Precision, compiles_nothing, register


def _slots(batch: Batch, t_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(page ids [bs, Tmax], slots [Tmax])``: where each request's token ``t`` is (page 0
    past T_b, never a fill value)."""
    ps = batch.case.attention.page_size
    tok = torch.arange(t_max, device=batch.device)
    cols = batch.block_tables[:, tok // ps].long()  # [bs, Tmax]
    used = tok.view(1, -1) < batch.seq_lens.view(-1, 1)
    return torch.where(used, cols, 0), tok % ps


def _gather(pages: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """``[bs, H_kv, Tmax, D]`` float32 keys or values of every request (garbage past T_b)."""
    cols, slots = where
    picked = pages[cols, :, slots]  # [bs, Tmax, H_kv, D]
    return picked.float().permute(0, 2, 1, 3)


def _bias(batch: Batch, t_max: int) -> torch.Tensor:
    """Additive mask ``[bs, 1, L, Tmax]``: 0 where visible, -inf elsewhere."""
    bs, L = batch.batch_size, batch.q_len
    seq = batch.seq_lens.long().view(bs, 1, 1)
    pos = seq - L + torch.arange(L, device=batch.device).view(1, L, 1)
    key = torch.arange(t_max, device=batch.device).view(1, 1, t_max)
    visible = key <= pos
    if batch.window_left >= 0:
        visible &= key >= pos - batch.window_left
    draft_idx = key - (seq - L)  # index inside the draft block, negative for the prefix
    in_draft = draft_idx >= 0
    # Ragged requests are laid out in a frame of L rows each (their rows last), with their
    # draft masks moved to match (Batch.frame_rows, Batch.frame_draft_mask).
    mask = batch.frame_draft_mask() if batch.is_ragged else batch.draft_mask.unsqueeze(0)
    allowed = torch.gather(mask.expand(bs, L, L), 2, draft_idx.clamp(0, L - 1).expand(bs, L, t_max))
    visible &= ~in_draft | allowed
    zero = torch.zeros((), device=batch.device)
    return torch.where(visible, zero, float("-inf")).unsqueeze(1)


def run(batch: Batch) -> torch.Tensor:
    a = batch.case.attention
    bs, L = batch.batch_size, batch.q_len
    q = batch.frame_queries().view(bs, L, a.num_qo_heads, a.head_dim).transpose(1, 2)
    t_max = int(batch.seq_lens.max())
    where = _slots(batch, t_max)
    k, v = _gather(batch.k_pages, where), _gather(batch.v_pages, where)  # [bs, H_kv, T, D]
    bias = _bias(batch, t_max).expand(bs, a.num_qo_heads, L, -1)
    if batch.sinks is not None:
        zeros = torch.zeros(bs, a.num_kv_heads, 1, a.head_dim, device=batch.device)
        k = torch.cat([k, zeros], dim=2)
        v = torch.cat([v, zeros], dim=2)
        sink = batch.sinks.float().view(1, -1, 1, 1).expand(bs, -1, L, 1)
        bias = torch.cat([bias, sink], dim=3)
    # SDPA computes softmax(scale * q k^T + attn_mask): the sink key is zero, so its logit
    # is exactly the sink. enable_gqa: query head h reads KV head h // group, with no copy
    # of K and V per query head.
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, scale=batch.bmm1_scale, enable_gqa=a.group_size > 1
    )
    return batch.output_from_frame((out * batch.bmm2_scale).transpose(1, 2))


register(
    KernelPath(
        name="torch-sdpa",
        run=run,
        side="reference",
        build_key=compiles_nothing,
        modes=PathModes(ragged=accepts),
        precision=lambda case: Precision(p_dtype="fp32"),
        description="PyTorch SDPA over the gathered paged cache, float32 (CPU or GPU)",
    )
)
