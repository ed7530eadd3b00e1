"""Skip-softmax: a reference of the skipping, and the bound on what it may change.

FlashInfer's ``skip_softmax_threshold_scale_factor`` lets a kernel leave out KV tiles whose
scores are far below the row's running maximum. The rule, read from the FMHAv2 SM90 kernel
(``fmha_v2/fmha/warpspec/epilogue.h``, ``compute.h``): with ``tau_b = factor / T_b`` (``T_b``
the request's KV length), a KV tile after the first is skipped when, for every row voting,
``exp(tile_max - running_max) < tau_b``; a skipped tile updates neither the running maximum
nor the sum, and adds nothing to the output. A row that has seen no key yet (running maximum
``-inf``) votes against skipping.

:func:`skipping_attention` computes attention that way (tiles of a given number of tokens,
each request and query head voting over its rows), so the bound can be tested against it;
:func:`skip_allowance` is the bound itself (``docs/semantics.md``, "Skip-softmax"): the
skipped keys hold at most ``eps`` of the kept softmax mass (``tau_b * (n - 1)`` for a row that
sees ``n`` keys, or less: the mass of the keys a skipped tile can hold), and the output moves by
at most ``|bmm2_scale| * eps / (1 + eps) * R``, where ``R`` is the range of the value channel
over the visible keys (zero included with sinks).
"""

from __future__ import annotations

import torch

from difftest.oracle.attention import AttentionTerms, attention_terms

COMPARISON_SLACK = 1.0 + 2.0**-20
"""A kernel decides ``exp2f(x) < tau`` in float32: ``exp2f`` and the scaling of ``x`` are
correct to a few ulps, so a skipped tile's ratio may reach ``tau`` times this."""
SCORE_SLACK = 2.0**-10
"""A kernel's scores are float32 sums of bf16/fp8 products, the oracle's float64 ones: a key
the kernel finds below its cut may be up to ``SCORE_SLACK * (1 + |M|)`` logits above the
oracle's (far more than float32 accumulation over a head dimension of 256 gives)."""


def thresholds(factor: float, seq_lens: torch.Tensor) -> torch.Tensor:
    """float64 ``[bs]``: ``tau_b = factor / T_b``."""
    return factor / seq_lens.to(torch.float64)


def skipping_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    *,
    factor: float,
    tile_tokens: int,
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    draft_mask: torch.Tensor | None = None,
    q_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Attention that skips KV tiles as the rule allows, in float64.

    Arguments as :func:`~difftest.oracle.attention.paged_attention_reference`, plus the
    ``factor`` and the tile size in tokens (tile ``j`` holds keys ``j * tile_tokens ..``).
    Returns the output ``[R, H_q, D]`` and the share of (request, head, tile) triples that had
    a visible key and were skipped.
    """
    terms = attention_terms(
        q,
        k_pages,
        v_pages,
        block_tables,
        seq_lens,
        q_len,
        bmm1_scale=bmm1_scale,
        window_left=window_left,
        draft_mask=draft_mask,
        q_lens=q_lens,
    )
    tau = thresholds(factor, terms.lens) * COMPARISON_SLACK
    live = _live_slots(terms)
    sink = None if sinks is None else sinks.to(device=q.device, dtype=torch.float64)
    outs, skipped, tiles = [], 0, 0
    for chunk in terms.chunks():
        s, v = chunk.scores, chunk.values  # [b, l, h, t], [b, t, h, d]
        b, L, h, t = s.shape
        m = torch.full((b, L, h), float("-inf"), dtype=s.dtype, device=s.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros((b, L, h, v.shape[-1]), dtype=s.dtype, device=s.device)
        rows = live[chunk.start : chunk.stop, :, None]  # [b, l, 1]: slots holding a query
        for first in range(0, t, tile_tokens):
            tile = slice(first, min(first + tile_tokens, t))
            local = s[..., tile].amax(dim=-1)  # [b, l, h]
            if first == 0:
                skip = torch.zeros((b, 1, h), dtype=torch.bool, device=s.device)
            else:
                # exp(-inf - (-inf)) is NaN, and NaN < tau is false: a row that has seen
                # nothing never votes to skip; a row that sees nothing in the tile does.
                ratio = torch.exp(local - m)
                vote = (ratio < tau[chunk.start : chunk.stop, None, None]) | ~rows
                skip = vote.all(dim=1, keepdim=True)  # [b, 1, h]: every row of the head
            has_key = torch.isfinite(local) & rows
            tiles += int(has_key.any(dim=1).sum())
            skipped += int((skip[:, 0] & has_key.any(dim=1)).sum())
            keep = ~skip
            m_new = torch.where(keep, torch.maximum(m, local), m)
            safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - safe)
            p = torch.exp(s[..., tile] - safe[..., None])  # [b, l, h, tile]
            p = torch.where(keep[..., None], p, torch.zeros_like(p))
            denom = torch.where(keep, denom * alpha + p.sum(dim=-1), denom)
            upd = torch.einsum("blht,bthd->blhd", p, v[:, tile])
            acc = torch.where(keep[..., None], acc * alpha[..., None] + upd, acc)
            m = m_new
        if sink is not None:
            m_new = torch.maximum(m, sink)
            alpha = torch.exp(m - m_new)
            denom = denom * alpha + torch.exp(sink - m_new)
            acc = acc * alpha[..., None]
        out = acc / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]
        outs.append(bmm2_scale * out)
    return terms.rows_of(outs), skipped / tiles if tiles else 0.0


def skip_allowance(
    terms: AttentionTerms, factor: float, bmm2_scale: float, sinks: bool
) -> torch.Tensor:
    """float64 ``[bs]``: the most skipping may move any output element of each request
    (derivation: ``docs/semantics.md``, "Skip-softmax").

    Per query row and head, with ``M`` its largest visible score and ``n`` its visible keys:
    the skipped keys' softmax mass relative to the kept keys' is at most ``eps``, the smaller of
    ``tau_b * (n - 1)`` (any rule-abiding skip) and, when ``tau_b < 1`` (the row's largest key
    can then never be skipped), ``c = sum of exp(s_j - M)`` over the keys ``s_j < M + ln
    tau_b`` (the only keys a skipped tile can hold). The output moves by at most ``|bmm2_scale|
    * eps / (1 + eps) * R``, ``R`` the head's largest range of a value channel over the keys the
    request's rows see (zero joins them with sinks); the request's allowance is the largest over
    its rows and heads. Float32 decisions are allowed for: ``tau_b`` is taken
    ``COMPARISON_SLACK`` larger and ``M + ln tau_b`` :data:`SCORE_SLACK` logits higher.
    """
    tau = thresholds(factor, terms.lens) * COMPARISON_SLACK
    live = _live_slots(terms)
    out = torch.zeros(terms.lens.shape[0], dtype=torch.float64, device=terms.lens.device)
    for chunk in terms.chunks():
        visible = chunk.visible  # [b, l, t]
        s = chunk.scores  # [b, l, h, t], -inf where not visible
        t_b = tau[chunk.start : chunk.stop].view(-1, 1, 1)  # [b, 1, 1]
        n = visible.sum(dim=-1).to(torch.float64)[:, :, None]  # [b, l, 1]
        any_rule = t_b * (n - 1).clamp(min=0)  # [b, l, 1]
        top = s.amax(dim=-1)  # [b, l, h]
        safe_top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        cut = safe_top + torch.log(t_b) + SCORE_SLACK * (1 + safe_top.abs())
        below = s < cut[..., None]
        mass = torch.where(below, torch.exp(s - safe_top[..., None]), torch.zeros_like(s))
        mass = mass.sum(dim=-1)  # [b, l, h]
        max_kept = t_b * torch.exp(torch.tensor(SCORE_SLACK, dtype=torch.float64)) < 1
        eps = torch.where(max_kept, torch.minimum(mass, any_rule), any_rule.expand_as(mass))
        eps = torch.where(live[chunk.start : chunk.stop, :, None], eps, torch.zeros_like(eps))
        share = eps / (1 + eps)  # [b, l, h]
        seen = visible.any(dim=1)[:, :, None, None]  # [b, t, 1, 1]
        v = chunk.values  # [b, t, h, d], zero where unseen
        hi = torch.where(seen, v, torch.full_like(v, float("-inf"))).amax(dim=1)  # [b, h, d]
        lo = torch.where(seen, v, torch.full_like(v, float("inf"))).amin(dim=1)
        if sinks:
            hi, lo = hi.clamp(min=0), lo.clamp(max=0)
        spread = torch.where(hi >= lo, hi - lo, torch.zeros_like(hi)).amax(dim=-1)  # [b, h]
        moved = share * spread[:, None, :]  # [b, l, h]
        out[chunk.start : chunk.stop] = abs(bmm2_scale) * moved.amax(dim=(1, 2))
    return out


def _live_slots(terms: AttentionTerms) -> torch.Tensor:
    """bool ``[bs, L]``: the frame slots that hold a query row (all, unless ragged)."""
    bs, L = terms.lens.shape[0], terms.q_len
    live = torch.ones(bs * L, dtype=torch.bool, device=terms.lens.device)
    if terms.rows is not None:
        live = torch.zeros_like(live)
        live[terms.rows] = True
    return live.view(bs, L)
