"""The reference semantics of paged-KV attention for speculative-decoding batches.

This module is the executable form of ``docs/semantics.md`` §2. It is written to be read,
not to be fast: every step is an explicit tensor operation, scores and outputs are ``einsum``
calls with named dimensions, and each masking rule is a tiny helper of its own.

Dimension names used in the ``einsum`` strings: ``b`` request, ``l`` query row inside the
request's draft block, ``h`` query head, ``t`` key position (absolute, from 0), ``d`` head dim.

Besides :func:`paged_attention_reference`, the masking rules (:func:`visible_keys`) and the
softmax (:func:`softmax_with_sinks`) are public, so that tools explaining a kernel's error
(``difftest explain``) use these definitions instead of restating them.
"""

from __future__ import annotations

import torch

# Requests are processed in chunks whose gathered K/V and scores stay below this many elements
# each (a single request larger than that is one chunk on its own).
_CHUNK_ELEMENTS = 2**27


def _causal(pos: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Bottom-right aligned causality: row at position ``pos`` sees keys ``key <= pos``."""
    return key <= pos


def _window(pos: torch.Tensor, key: torch.Tensor, window_left: int) -> torch.Tensor:
    """Sliding window, inclusive: keys ``pos - window_left <= key``; ``-1`` disables it."""
    if window_left < 0:
        return torch.ones_like(key, dtype=torch.bool)
    return key >= pos - window_left


def _draft(mask: torch.Tensor, key: torch.Tensor, first_new: torch.Tensor) -> torch.Tensor:
    """Tree-draft mask: prefix keys always pass, draft key ``first_new + m`` needs ``mask[l, m]``.

    ``mask`` is ``[b, L, L]``, ``key`` is ``[1, 1, T]``, ``first_new`` is ``[b, 1, 1]``.
    """
    m = key - first_new  # index of the key inside the draft block, negative in the prefix
    in_prefix = m < 0
    # Clamp before the gather so prefix keys (and keys past T_b) index a valid column;
    # their gathered value is discarded by ``in_prefix`` or by causality.
    m_safe = m.clamp(0, mask.shape[-1] - 1).expand(mask.shape[0], mask.shape[1], -1)
    return in_prefix | torch.gather(mask, 2, m_safe)


def visible_keys(
    seq_lens: torch.Tensor,
    q_len: int,
    num_keys: int,
    *,
    window_left: int = -1,
    draft_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which keys each query row may see: bool ``[bs, L, num_keys]``, ``[b, i, t]`` true iff
    row ``i`` of request ``b`` (at position ``seq_lens[b] - L + i``) may see key ``t``.

    The rules of :func:`paged_attention_reference` (docs/semantics.md §2): causal (bottom-right
    aligned), inside the window (``window_left``, ``-1`` = none) and allowed by the draft mask
    (``[L, L]`` or ``[bs, L, L]``, ``None`` = a chain draft). No key ``t >= seq_lens[b]`` is
    ever visible.
    """
    dev = seq_lens.device
    t_b = seq_lens.to(dtype=torch.long)[:, None, None]  # [b, 1, 1]
    mask = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool, device=dev))
    if draft_mask is not None:
        mask = draft_mask.to(device=dev, dtype=torch.bool)
    mask = mask.expand(t_b.shape[0], q_len, q_len)
    first_new = t_b - q_len
    pos = first_new + torch.arange(q_len, device=dev)[None, :, None]  # [b, l, 1]
    key = torch.arange(num_keys, device=dev)[None, None, :]  # [1, 1, t]
    return _causal(pos, key) & _window(pos, key, window_left) & _draft(mask, key, first_new)


def softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of ``s`` ``[..., h, t]`` (masked keys hold ``-inf``), as
    :func:`paged_attention_reference` takes it.

    A sink ``[h]`` joins the max and the denominator only, like an extra key whose value is 0.
    A row with every key masked and no sink gets probabilities 0 (its output is 0).
    """
    m = s.amax(dim=-1)
    if sinks is not None:
        m = torch.maximum(m, sinks)
    # An empty row (every key masked, no sink) has m = -inf; use 0 so exp() gives 0, not NaN.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m[..., None])
    denom = e.sum(dim=-1)
    if sinks is not None:
        denom = denom + torch.exp(sinks - m)
    # Empty rows have e == 0 everywhere; dividing by 1 instead of 0 makes their output 0.
    return e / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]


def paged_attention_reference(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    *,
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    draft_mask: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    p_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention of ``L`` new query rows per request over a paged KV cache (docs/semantics.md §2).

    Parameters
    ----------
    q : Tensor ``[bs * L, H_q, D]``
        Query rows; row ``b * L + i`` is row ``i`` of request ``b``. Any float dtype.
    k_pages, v_pages : Tensor ``[num_pages, H_kv, page_size, D]``
        HND pages, any strides (a permuted view is fine), any float dtype incl. fp8 e4m3.
    block_tables : Tensor ``[bs, W]`` int32/int64
        Token ``t`` of request ``b`` is at page ``block_tables[b, t // page_size]``, slot
        ``t % page_size``. Columns past ``ceil(T_b / page_size)`` are never read.
    seq_lens : Tensor ``[bs]`` int
        ``T_b = P_b + L``, the KV length including the ``L`` new tokens.
    q_len : int
        ``L``, the query rows per request.
    bmm1_scale : float
        Logits are ``bmm1_scale * <q, k>`` (``sm_scale * q_scale * k_scale``).
    bmm2_scale : float
        The output is multiplied by it (``v_scale / o_scale``).
    window_left : int
        Row at position ``p`` sees keys ``p - window_left <= j <= p``; ``-1`` = no window.
    sinks : Tensor ``[H_q]`` or None
        Per query head, logit units; adds ``exp(sink - max)`` to the denominator only.
    draft_mask : Tensor ``[L, L]`` or ``[bs, L, L]`` bool, or None
        Row ``i`` may see draft token ``m`` iff ``mask[i, m]`` (and ``m <= i``); the prefix is
        always visible. None means a chain draft (plain causal).
    compute_dtype : torch.dtype
        Every input is upcast to it; the result has this dtype.
    p_dtype : torch.dtype or None
        If set, the probabilities are rounded to it before ``P @ V`` (emulates a kernel).

    Returns
    -------
    Tensor ``[bs * L, H_q, D]`` in ``compute_dtype``. A row with no visible key is 0.
    """
    num_rows, h_q, d = q.shape
    _, h_kv, page_size, _ = k_pages.shape
    bs = seq_lens.shape[0]
    if num_rows != bs * q_len or h_q % h_kv != 0 or v_pages.shape != k_pages.shape:
        raise ValueError(
            f"shapes disagree: q {tuple(q.shape)}, bs {bs}, L {q_len}, "
            f"k {tuple(k_pages.shape)}, v {tuple(v_pages.shape)}"
        )
    if bs == 0:
        return torch.zeros(0, h_q, d, dtype=compute_dtype, device=q.device)
    lens = seq_lens.to(device=q.device, dtype=torch.long)
    t_max = int(lens.max())
    if int(lens.min()) < q_len or -(-t_max // page_size) > block_tables.shape[1]:
        raise ValueError(f"seq_lens {lens.tolist()} need >= L={q_len} and fit the block table")
    mask = None
    if draft_mask is not None:
        mask = draft_mask.to(device=q.device, dtype=torch.bool).expand(bs, q_len, q_len)
    sink = None if sinks is None else sinks.to(device=q.device, dtype=compute_dtype)
    kv_head = torch.arange(h_q, device=q.device) // (h_q // h_kv)  # GQA: h -> h // group
    # Token-major views: [num_pages, page_size, H_kv, D], indexed by (page id, slot).
    k_tok, v_tok = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    q_all = q.reshape(bs, q_len, h_q, d).to(compute_dtype)
    per_request = t_max * h_q * max(d, q_len)
    chunk = max(1, _CHUNK_ELEMENTS // per_request)
    outs = []
    for start in range(0, bs, chunk):
        stop = min(start + chunk, bs)
        t_b = lens[start:stop, None]  # [b, 1]
        n = int(t_b.max())
        key = torch.arange(n, device=q.device)[None, :]  # [1, t]

        # 1. Which key each row may see: [b, l, t].
        visible = visible_keys(
            t_b[:, 0],
            q_len,
            n,
            window_left=window_left,
            draft_mask=None if mask is None else mask[start:stop],
        )

        # 2. Gather K/V token by token. Zero the page id of tokens past T_b *before* the gather:
        # table columns past the used pages may hold garbage (even out-of-range ids) and must
        # never be dereferenced.
        in_use = key < t_b  # [b, t]
        table = block_tables[start:stop].to(device=q.device, dtype=torch.long)
        pages = table[:, key[0] // page_size]  # [b, t]
        pages = torch.where(in_use, pages, torch.zeros_like(pages))
        slots = (key % page_size).expand_as(pages)
        k = k_tok[pages, slots].to(compute_dtype)  # [b, t, H_kv, d]
        v = v_tok[pages, slots].to(compute_dtype)
        # Stale slots and keys no row may see are zeroed: 0 * NaN would otherwise leak into P @ V.
        seen = visible.any(dim=1)[:, :, None, None]  # [b, t, 1, 1]
        k = torch.where(seen, k, torch.zeros_like(k))[:, :, kv_head, :]  # [b, t, h, d]
        v = torch.where(seen, v, torch.zeros_like(v))[:, :, kv_head, :]

        # 3. Scores, softmax and output.
        s = bmm1_scale * torch.einsum("blhd,bthd->blht", q_all[start:stop], k)
        s = torch.where(visible[:, :, None, :], s, torch.full_like(s, float("-inf")))
        p = softmax_with_sinks(s, sink)
        if p_dtype is not None:
            p = p.to(p_dtype).to(compute_dtype)
        outs.append(bmm2_scale * torch.einsum("blht,bthd->blhd", p, v))
    return torch.cat(outs).reshape(num_rows, h_q, d)
