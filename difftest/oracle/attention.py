"""The reference semantics of paged-KV attention for speculative-decoding batches.

This module is the executable form of ``docs/semantics.md`` §2. It is written to be read,
not to be fast: every step is an explicit tensor operation, scores and outputs are ``einsum``
calls with named dimensions, and each masking rule is a tiny helper of its own.

Dimension names used in the ``einsum`` strings: ``b`` request, ``l`` query row inside the
request's draft block, ``h`` query head, ``t`` key position (absolute, from 0), ``d`` head dim.
Ragged requests (fewer new tokens than ``L``) are laid out in the same ``L`` slots, their rows
in the last ones (:class:`AttentionTerms`), so every rule below is written once.

Besides :func:`paged_attention_reference`, the masking rules (:func:`visible_keys`), the
softmax (:func:`softmax_with_sinks`) and the laid-out terms (:func:`attention_terms`) are
public, so that tools explaining a kernel's error (``difftest explain``) and the skip-softmax
reference use these definitions instead of restating them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

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
    q_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which keys each query row may see: bool ``[bs, L, num_keys]``, ``[b, i, t]`` true iff
    slot ``i`` of request ``b`` (at position ``seq_lens[b] - L + i``) may see key ``t``.

    The rules of :func:`paged_attention_reference` (docs/semantics.md §2): causal (bottom-right
    aligned), inside the window (``window_left``, ``-1`` = none) and allowed by the draft mask
    (``[L, L]`` or ``[bs, L, L]``, ``None`` = a chain draft). No key ``t >= seq_lens[b]`` is
    ever visible. With ``q_lens`` (ragged verify) the slots are the uniform frame's
    (:class:`AttentionTerms`): request ``b``'s rows are its last ``q_lens[b]`` slots, its draft
    mask's top-left block moved there; the slots before them hold no row.
    """
    dev = seq_lens.device
    t_b = seq_lens.to(dtype=torch.long)[:, None, None]  # [b, 1, 1]
    mask = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool, device=dev))
    if draft_mask is not None:
        mask = draft_mask.to(device=dev, dtype=torch.bool)
    mask = mask.expand(t_b.shape[0], q_len, q_len)
    if q_lens is not None:
        mask = _frame_mask(mask, q_lens.to(device=dev, dtype=torch.long), q_len)
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
    e, denom = exp_and_denominator(s, sinks)
    return e / denom[..., None]


def exp_and_denominator(
    s: torch.Tensor, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax of :func:`softmax_with_sinks` before its division: ``exp(s - m)`` (``m`` the
    row's max, the sink included, so the largest term is 1 unless the sink is larger) and
    the row sums ``[..., h]`` it is divided by (the sink's term included; 1 for a row whose
    terms are all 0, so that its output is 0, not NaN)."""
    m = s.amax(dim=-1)
    if sinks is not None:
        m = torch.maximum(m, sinks)
    # An empty row (every key masked, no sink) has m = -inf; use 0 so exp() gives 0, not NaN.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m[..., None])
    if e.dtype == torch.float32:
        # A float32 kernel on a GPU flushes subnormal results to zero (CUDA's ex2.approx.ftz,
        # -ftz=true), and PyTorch's CPU SDPA writes 0 there too (torch.exp itself keeps
        # subnormals): a probability below 2^-126 may be 0. The float64 oracle keeps it; the
        # float32 precision drops it. (Half-precision arithmetic keeps its subnormals.)
        e = torch.where(e < torch.finfo(e.dtype).tiny, 0.0, e)
    denom = e.sum(dim=-1)
    if sinks is not None:
        denom = denom + torch.exp(sinks - m)
    # Empty rows have e == 0 everywhere; dividing by 1 instead of 0 makes their output 0.
    return e, torch.where(denom > 0, denom, torch.ones_like(denom))


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
    q_lens: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
    p_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention of the new query rows of each request over a paged KV cache
    (docs/semantics.md §2).

    Parameters
    ----------
    q : Tensor ``[R, H_q, D]``
        Query rows, request by request: ``R = bs * L`` and row ``b * L + i`` is row ``i`` of
        request ``b``; with ``q_lens``, ``R = sum(q_lens)``. Any float dtype.
    k_pages, v_pages : Tensor ``[num_pages, H_kv, page_size, D]``
        HND pages, any strides (a permuted view is fine), any float dtype incl. fp8 e4m3.
    block_tables : Tensor ``[bs, W]`` int32/int64
        Token ``t`` of request ``b`` is at page ``block_tables[b, t // page_size]``, slot
        ``t % page_size``. Columns past ``ceil(T_b / page_size)`` are never read.
    seq_lens : Tensor ``[bs]`` int
        ``T_b = P_b + L_b``, the KV length including the request's new tokens.
    q_len : int
        ``L``, the query rows per request (with ``q_lens``: the largest count).
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
        always visible. None means a chain draft (plain causal). A ragged request of ``L_b``
        new tokens uses the top-left ``L_b x L_b`` block.
    q_lens : Tensor ``[bs]`` int, or None
        Ragged verify: request ``b`` has ``q_lens[b] <= L`` new tokens, its rows are positions
        ``T_b - q_lens[b] .. T_b - 1``. None: every request has ``L``.
    compute_dtype : torch.dtype
        Every input is upcast to it; the result has this dtype.
    p_dtype : torch.dtype or None
        If set, the unnormalised probabilities ``exp(s - m)`` are rounded to it before they
        multiply V, and the product is divided by their unrounded sum (emulates a kernel).

    Returns
    -------
    Tensor ``[R, H_q, D]`` in ``compute_dtype``. A row with no visible key is 0.
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
        compute_dtype=compute_dtype,
    )
    sink = None if sinks is None else sinks.to(device=q.device, dtype=compute_dtype)
    outs = []
    for chunk in terms.chunks():
        if p_dtype is None:
            p = softmax_with_sinks(chunk.scores, sink)
            o = bmm2_scale * torch.einsum("blht,bthd->blhd", p, chunk.values)
        else:
            # A kernel rounds the terms exp(s - m) it multiplies V by, and divides by their
            # unrounded sum at the end (the largest term, 1, is exact): flash-style kernels
            # keep P unnormalised until the last step (XQA's fp8 kernel on the H200 gave the
            # bits of this and not of rounding normalised probabilities, docs/validation.md)
            e, denom = exp_and_denominator(chunk.scores, sink)
            e = e.to(p_dtype).to(compute_dtype)
            summed = torch.einsum("blht,bthd->blhd", e, chunk.values)
            o = bmm2_scale * (summed / denom[..., None])
        if o.dtype == torch.float32:  # its subnormal results flushed too, as a GPU's are
            o = torch.where(o.abs() < torch.finfo(o.dtype).tiny, 0.0, o)
        outs.append(o)
    return terms.rows_of(outs)


@dataclass(frozen=True, slots=True)
class Chunk:
    """The scores and values of requests ``start..stop-1`` in the uniform frame.

    ``scores`` ``[b, l, h, t]``: ``bmm1_scale * <q, k>``, ``-inf`` where the row may not see the
    key; ``values`` ``[b, t, h, d]`` (zero where no row sees the key); ``visible`` ``[b, l, t]``.
    """

    start: int
    stop: int
    scores: torch.Tensor
    values: torch.Tensor
    visible: torch.Tensor


@dataclass(frozen=True, slots=True)
class AttentionTerms:
    """What softmax and ``P @ V`` need, chunk by chunk of requests (:func:`attention_terms`).

    The rows live in a *uniform frame* of ``L`` slots per request: a ragged request's rows sit in
    its last ``q_lens[b]`` slots (``rows`` says where), so slot ``l`` is at position
    ``T_b - L + l`` for every request; the frame's other slots see nothing that matters and are
    dropped by :meth:`rows_of`.
    """

    q: torch.Tensor  # [bs, L, H_q, D] in the compute dtype
    k_tok: torch.Tensor  # [num_pages, page_size, H_kv, D] token-major view
    v_tok: torch.Tensor
    block_tables: torch.Tensor
    lens: torch.Tensor  # [bs] long
    mask: torch.Tensor  # [bs, L, L] bool, the draft block in the frame
    q_len: int
    page_size: int
    bmm1_scale: float
    window_left: int
    kv_head: torch.Tensor  # [H_q]: the KV head of each query head
    compute_dtype: torch.dtype
    rows: torch.Tensor | None  # [R] slot of each ragged row in the flattened frame; None: all

    def chunks(self) -> Iterator[Chunk]:
        bs = self.lens.shape[0]
        if bs == 0:
            return
        h_q, d = self.q.shape[2], self.q.shape[3]
        t_max = int(self.lens.max())
        per_request = t_max * h_q * max(d, self.q_len)
        step = max(1, _CHUNK_ELEMENTS // per_request)
        for start in range(0, bs, step):
            stop = min(start + step, bs)
            yield self._chunk(start, stop)

    def _chunk(self, start: int, stop: int) -> Chunk:
        dev, L, ps = self.q.device, self.q_len, self.page_size
        t_b = self.lens[start:stop, None]  # [b, 1]
        n = int(t_b.max())
        key = torch.arange(n, device=dev)[None, :]  # [1, t]

        # 1. Which key each row may see: [b, l, t] (the mask is already in the frame).
        visible = visible_keys(
            t_b[:, 0], L, n, window_left=self.window_left, draft_mask=self.mask[start:stop]
        )

        # 2. Gather K/V token by token. Zero the page id of tokens past T_b *before* the gather:
        # table columns past the used pages may hold garbage (even out-of-range ids) and must
        # never be dereferenced.
        in_use = key < t_b  # [b, t]
        table = self.block_tables[start:stop].to(device=dev, dtype=torch.long)
        pages = table[:, key[0] // ps]  # [b, t]
        pages = torch.where(in_use, pages, torch.zeros_like(pages))
        slots = (key % ps).expand_as(pages)
        k = self.k_tok[pages, slots].to(self.compute_dtype)  # [b, t, H_kv, d]
        v = self.v_tok[pages, slots].to(self.compute_dtype)
        # Stale slots and keys no row may see are zeroed: 0 * NaN would otherwise leak into P @ V.
        seen = visible.any(dim=1)[:, :, None, None]  # [b, t, 1, 1]
        k = torch.where(seen, k, torch.zeros_like(k))[:, :, self.kv_head, :]  # [b, t, h, d]
        v = torch.where(seen, v, torch.zeros_like(v))[:, :, self.kv_head, :]

        # 3. Scores, masked.
        s = self.bmm1_scale * torch.einsum("blhd,bthd->blht", self.q[start:stop], k)
        s = torch.where(visible[:, :, None, :], s, torch.full_like(s, float("-inf")))
        return Chunk(start=start, stop=stop, scores=s, values=v, visible=visible)

    def rows_of(self, outs: list[torch.Tensor]) -> torch.Tensor:
        """The chunks' outputs ``[b, l, h, d]`` joined, as the caller's rows ``[R, H_q, D]``."""
        h_q, d = self.q.shape[2], self.q.shape[3]
        if not outs:
            return torch.zeros(0, h_q, d, dtype=self.compute_dtype, device=self.q.device)
        flat = torch.cat(outs).reshape(-1, h_q, d)
        return flat if self.rows is None else flat[self.rows]


def attention_terms(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    *,
    bmm1_scale: float,
    window_left: int = -1,
    draft_mask: torch.Tensor | None = None,
    q_lens: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> AttentionTerms:
    """The inputs of :func:`paged_attention_reference` checked and laid out in the uniform
    frame (arguments as there): what every reference computation of this package starts from."""
    num_rows, h_q, d = q.shape
    _, h_kv, page_size, _ = k_pages.shape
    bs = seq_lens.shape[0]
    L = q_len
    counts = None if q_lens is None else q_lens.to(device=q.device, dtype=torch.long)
    expected_rows = bs * L if counts is None else int(counts.sum())
    if num_rows != expected_rows or h_q % h_kv != 0 or v_pages.shape != k_pages.shape:
        raise ValueError(
            f"shapes disagree: q {tuple(q.shape)}, bs {bs}, L {L}, "
            f"k {tuple(k_pages.shape)}, v {tuple(v_pages.shape)}"
        )
    if counts is not None and (
        counts.shape != (bs,) or bool((counts < 1).any()) or bool((counts > L).any())
    ):
        raise ValueError(f"q_lens {counts.tolist()} need one count in [1, L={L}] per request")
    lens = seq_lens.to(device=q.device, dtype=torch.long)
    need = torch.full_like(lens, L) if counts is None else counts
    t_max = int(lens.max()) if bs else 0
    if bs and (bool((lens < need).any()) or -(-t_max // page_size) > block_tables.shape[1]):
        raise ValueError(
            f"seq_lens {lens.tolist()} need >= each request's new tokens and fit the block table"
        )
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool, device=q.device))
    if draft_mask is not None:
        mask = draft_mask.to(device=q.device, dtype=torch.bool)
    mask = mask.expand(bs, L, L)
    frame_q = q.to(compute_dtype)
    rows = None
    if counts is not None:
        rows = _frame_rows(counts, L)
        frame_q = torch.zeros(bs * L, h_q, d, dtype=compute_dtype, device=q.device)
        frame_q[rows] = q.to(compute_dtype)
        mask = _frame_mask(mask, counts, L)
    return AttentionTerms(
        q=frame_q.reshape(bs, L, h_q, d),
        # Token-major views: [num_pages, page_size, H_kv, D], indexed by (page id, slot).
        k_tok=k_pages.transpose(1, 2),
        v_tok=v_pages.transpose(1, 2),
        block_tables=block_tables,
        lens=lens,
        mask=mask,
        q_len=L,
        page_size=page_size,
        bmm1_scale=bmm1_scale,
        window_left=window_left,
        kv_head=torch.arange(h_q, device=q.device) // (h_q // h_kv),  # GQA: h -> h // group
        compute_dtype=compute_dtype,
        rows=rows,
    )


def _frame_rows(counts: torch.Tensor, L: int) -> torch.Tensor:
    """``[R]``: the frame slot ``b * L + l`` of each ragged row, request ``b``'s rows in its last
    ``counts[b]`` slots (so slot ``l`` is at position ``T_b - L + l``, as when uniform)."""
    bs = counts.shape[0]
    req = torch.repeat_interleave(torch.arange(bs, device=counts.device), counts)
    first_row = torch.cumsum(counts, 0) - counts
    within = torch.arange(req.shape[0], device=counts.device) - first_row[req]
    return req * L + (L - counts)[req] + within


def _frame_mask(mask: torch.Tensor, counts: torch.Tensor, L: int) -> torch.Tensor:
    """``[bs, L, L]``: each ragged request's draft block in the frame. Request ``b``'s draft
    tokens ``0..counts[b]-1`` sit at slots ``s = L - counts[b]`` on, so frame cell ``(l, m)``
    is the draft mask's ``(l - s, m - s)``; the columns before ``s`` are prefix keys (always
    visible), and so is everything in the rows before ``s``, which hold no query row."""
    s = (L - counts).view(-1, 1, 1)
    slot = torch.arange(L, device=mask.device)
    row, col = slot.view(1, -1, 1), slot.view(1, 1, -1)
    b = torch.arange(mask.shape[0], device=mask.device).view(-1, 1, 1)
    moved = mask[b, (row - s).clamp(min=0), (col - s).clamp(min=0)]
    return (col < s) | (row < s) | moved
