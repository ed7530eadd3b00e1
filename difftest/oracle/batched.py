"""The oracle at arithmetic speed: the semantics of :mod:`difftest.oracle.attention`, computed
for every request of a launch at once.

:func:`difftest.oracle.attention.paged_attention_reference` is the definition, written to be
read. This module computes the same thing the way a batched linear-algebra library likes it,
and is held to the definition by ``tests/unit/test_oracle_batched.py`` (within float64
rounding, over many generated cases):

- **one padded computation per launch**: the requests' query rows are laid out as
  ``[bs, L_max]`` (each request may have its own ``L_b``: rows of a ragged batch are packed
  request after request, as ``cu_seqlens_q`` describes them); rows past ``L_b`` are padding
  and never leave this module;
- **GQA without copies**: the query heads of one KV head are folded into the row dimension, so
  scores are one batched matrix product ``[bs, H_kv, L_max * g, D] @ [bs, H_kv, D, T_max]``
  and no K/V head is repeated;
- **no key no row sees**: with a sliding window, each request's keys start at the first one
  its first row's window holds, so a long windowed request costs its window, not its length;
- **one gather for several roundings**: a launch's K/V are gathered through the page table once
  (in their stored dtype, which every compute dtype holds exactly) and serve each
  :class:`Rounding` asked for, the float64 oracle and the noise floors at a kernel's precision.

This is the torch form. On a CUDA device with Triton the framework computes the float64
rounding (the oracle itself) and the noise floors' float32 roundings with
:func:`difftest.oracle.fused.batched_attention` instead, whose kernels read the pages in place
(the same sums within float64 rounding; float32 roundings of the same definition, adding in
another order; each kind checked at first use); on a CPU, and for anything the kernels do not
compute, every rounding runs here.

Requests are processed in chunks whose padded scores and gathered K/V stay below
:data:`CHUNK_ELEMENTS`, so a GPU-sized launch bounds its temporaries; a CPU case is one chunk.
A launch of several chunks groups its requests by length, so a chunk pads its short requests
to the longest of like ones, not to the launch's longest.
Dimension names: ``b`` request, ``l`` query row inside the request's new tokens, ``g`` query
head inside its KV head's group, ``t`` key position, ``d`` head dim.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

CHUNK_ELEMENTS = 2**26
"""Elements of a chunk's largest temporary, at most: its padded scores (``b * H_q * L_max *
T_max``) or its gathered K or V (``b * H_kv * T_max * D``, the larger when ``L_max * group < D``,
as in most verify batches); a single request larger than that is one chunk on its own
(:func:`_chunk_plan`)."""


@dataclass(frozen=True, slots=True)
class Rounding:
    """One computation of the launch: the queries it reads (``[R, H_q, D]``, any float dtype),
    the dtype every input is upcast to and the arithmetic runs in, and the dtype the
    probabilities are rounded to before ``P @ V`` (``None``: not rounded)."""

    q: torch.Tensor
    compute_dtype: torch.dtype = torch.float64
    p_dtype: torch.dtype | None = None


@dataclass(frozen=True, slots=True)
class Rows:
    """Where each request's query rows are: ``lens[b]`` rows from ``starts[b]`` (int64 ``[bs]``
    tensors on the queries' device)."""

    starts: torch.Tensor
    lens: torch.Tensor

    @classmethod
    def of(cls, q_lens: int | Sequence[int] | torch.Tensor, bs: int, device: torch.device) -> Rows:
        """Rows packed request after request: uniform ``L`` rows each (an int) or ``q_lens[b]``
        (a list goes through :func:`host_ints`: no wait for the device)."""
        if isinstance(q_lens, int):
            lens = torch.full((bs,), q_lens, dtype=torch.long, device=device)
        elif isinstance(q_lens, torch.Tensor):
            lens = q_lens.to(device=device, dtype=torch.long).reshape(-1)
        else:
            lens = host_ints(list(q_lens), device)
        starts = torch.cumsum(lens, 0) - lens
        return cls(starts=starts, lens=lens)


@dataclass(frozen=True, slots=True)
class HostLens:
    """A launch's lengths as the host knows them from its case: each request's ``T_b`` (``t``)
    and ``L_b`` (``l``). Given them, the oracle reads no tensor back (on a GPU each read is a
    wait for everything queued), and takes its lengths from them rather than from the
    ``seq_lens`` and ``q_lens`` tensors, which a materialised case holds the same."""

    t: Sequence[int]
    l: Sequence[int]  # noqa: E741  (the definition's L)


def host_ints(values: Sequence[int] | np.ndarray, dev: torch.device) -> torch.Tensor:
    """int64 ``values`` on ``dev``. Off a CPU they go through pinned memory, so the copy is
    queued behind the device's work and the host goes on (a tensor made from a list on a GPU
    would first wait for everything queued)."""
    pinned = dev.type == "cuda"
    host = torch.empty(len(values), dtype=torch.int64, pin_memory=pinned)
    host.numpy()[:] = values
    return host.to(dev, non_blocking=pinned)


def visibility(
    key: torch.Tensor,
    first_new: torch.Tensor,
    q_lens: torch.Tensor,
    l_max: int,
    window_left: int,
    draft: torch.Tensor,
) -> torch.Tensor:
    """``[b, l, t]``: which keys row ``l`` of request ``b`` may see (domain.md §2).

    ``key`` is ``[b, t]``, the key positions of each request, ``first_new`` (``T_b - L_b``, where
    the request's new tokens start) and ``q_lens`` are ``[b]``, ``draft`` is the ``[b, l, l]``
    visibility inside the new tokens.
    Row ``l`` is at position ``first_new + l``: it sees keys up to its position (causal,
    bottom-right aligned), none left of ``position - window_left`` (``-1``: no window), every
    prefix key, and the new tokens its draft row allows. Padding rows (``l >= L_b``) see
    nothing.
    """
    row = torch.arange(l_max, device=key.device)
    pos = first_new[:, None, None] + row[None, :, None]  # [b, l, 1]
    k = key[:, None, :]  # [b, 1, t]
    seen = (k <= pos) & (row[None, :, None] < q_lens[:, None, None])
    if window_left >= 0:
        seen &= k >= pos - window_left
    m = k - first_new[:, None, None]  # index inside the new tokens, negative in the prefix
    column = m.clamp(0, l_max - 1).expand(-1, l_max, -1)
    return seen & ((m < 0) | torch.gather(draft, 2, column))


@dataclass(frozen=True, slots=True)
class LaunchShape:
    """A launch's lengths on the host (the checks and the chunking are Python arithmetic):
    each request's query rows ``L_b``, KV length ``T_b`` and first key any of its rows sees
    (with a window, keys left of the first row's window are seen by no row of the request)."""

    rows: Rows
    l_host: list[int]
    t_host: list[int]
    first_host: list[int]


def launch_shape(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: int | Sequence[int] | torch.Tensor,
    roundings: Sequence[Rounding],
    window_left: int,
    host_lens: HostLens | None = None,
) -> LaunchShape:
    """The checked :class:`LaunchShape` of a launch (``ValueError`` if its shapes disagree);
    the arguments are :func:`batched_paged_attention`'s. Without ``host_lens`` the lengths
    are read back from ``seq_lens`` and ``q_lens``: on a GPU a wait for everything queued."""
    q0 = roundings[0].q
    num_rows, h_q, _ = q0.shape
    _, h_kv, page_size, _ = k_pages.shape
    bs = seq_lens.shape[0]
    if host_lens is not None:
        if len(host_lens.t) != bs or len(host_lens.l) != bs:
            raise ValueError(f"host lengths {host_lens} do not have the launch's {bs} requests")
        l_host, t_host = list(host_lens.l), list(host_lens.t)
        rows = Rows.of(l_host, bs, q0.device)
    else:
        rows = Rows.of(q_lens, bs, q0.device)
        l_host = rows.lens.tolist()
        t_host = seq_lens.tolist() if bs else []
    if (
        h_q % h_kv != 0
        or v_pages.shape != k_pages.shape
        or sum(l_host) != num_rows
        or any(r.q.shape != q0.shape for r in roundings)
    ):
        raise ValueError(
            f"shapes disagree: q {tuple(q0.shape)}, bs {bs}, q_lens {l_host}, "
            f"k {tuple(k_pages.shape)}, v {tuple(v_pages.shape)}"
        )
    if bs and (
        any(t < n for t, n in zip(t_host, l_host, strict=True))
        or -(-max(t_host) // page_size) > block_tables.shape[1]
    ):
        raise ValueError(f"seq_lens {t_host} need >= q_lens {l_host} and must fit the block table")
    first_host = [
        max(0, t - n - window_left) if window_left >= 0 else 0
        for t, n in zip(t_host, l_host, strict=True)
    ]
    return LaunchShape(rows=rows, l_host=l_host, t_host=t_host, first_host=first_host)


def draft_rows(
    draft_mask: torch.Tensor | None, bs: int, l_max: int, device: torch.device
) -> torch.Tensor:
    """``[bs, l_max, l_max]`` bool: the draft mask of every request (``None``: a chain)."""
    if draft_mask is None:
        chain = torch.ones(l_max, l_max, dtype=torch.bool, device=device).tril()
        return chain.expand(bs, l_max, l_max)
    mask = draft_mask.to(device=device, dtype=torch.bool)
    if mask.dim() == 2:
        mask = mask.expand(bs, -1, -1)
    if mask.shape[1:] != (l_max, l_max):
        raise ValueError(f"draft mask {tuple(mask.shape)} does not fit L_max={l_max}")
    return mask


def _exp_and_denominator(
    s: torch.Tensor, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim of ``s`` (``[b, H_kv, l, g, t]``, masked keys ``-inf``) before
    its division: ``exp(s - m)`` and the row sums ``[b, H_kv, l, g]`` (at least 1 where 0: a
    row that sees nothing gives 0, not NaN); a sink ``[H_kv, g]`` joins the max and the sum,
    like a key whose value is 0."""
    m = s.amax(dim=-1)
    if sinks is not None:
        m = torch.maximum(m, sinks[None, :, None, :])
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m[..., None])
    if e.dtype == torch.float32:  # subnormal probabilities flushed, as the definition does
        e = torch.where(e < torch.finfo(e.dtype).tiny, 0.0, e)
    denom = e.sum(dim=-1)
    if sinks is not None:
        denom = denom + torch.exp(sinks[None, :, None, :] - m)
    return e, torch.where(denom > 0, denom, torch.ones_like(denom))


def batched_paged_attention(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: int | Sequence[int] | torch.Tensor,
    roundings: Sequence[Rounding],
    *,
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    draft_mask: torch.Tensor | None = None,
    host_lens: HostLens | None = None,
) -> list[torch.Tensor]:
    """Paged-KV attention of every request of a launch, once per rounding.

    Parameters
    ----------
    k_pages, v_pages : Tensor ``[num_pages, H_kv, page_size, D]``
        HND pages, any strides, any float dtype including fp8 e4m3.
    block_tables : Tensor ``[bs, W]`` int
        Token ``t`` of request ``b`` is at page ``block_tables[b, t // page_size]``, slot
        ``t % page_size``; columns past ``ceil(T_b / page_size)`` are never read.
    seq_lens : Tensor ``[bs]`` int
        ``T_b``, the KV length including the request's new tokens.
    q_lens : int, or ``[bs]`` ints
        ``L``, the query rows of every request, or ``L_b`` per request; the rows of request
        ``b`` follow those of ``b - 1`` (``R = sum L_b``).
    roundings : sequence of :class:`Rounding`
        The computations wanted, each with its own queries ``[R, H_q, D]``.
    bmm1_scale, bmm2_scale, window_left, sinks
        As for :func:`difftest.oracle.attention.paged_attention_reference`.
    draft_mask : Tensor ``[L, L]`` or ``[bs, L_max, L_max]`` bool, or None
        Row ``i`` of a request may see its new token ``m`` iff ``mask[i, m]``; ``None``: chain.
    host_lens : HostLens, or None
        ``T_b`` and ``L_b`` on the host (the case's), used in place of ``seq_lens`` and
        ``q_lens``: nothing is read back from the device. ``None``: read them.

    Returns
    -------
    One ``[R, H_q, D]`` tensor per rounding, in its compute dtype; a row with no visible key
    is 0.
    """
    if not roundings:
        return []
    q0 = roundings[0].q
    dev = q0.device
    num_rows, h_q, d = q0.shape
    h_kv = k_pages.shape[1]
    bs = seq_lens.shape[0]
    shape = launch_shape(
        k_pages, v_pages, block_tables, seq_lens, q_lens, roundings, window_left, host_lens
    )
    # Every row is one request's and is written by its chunk: no fill needed.
    outs = [torch.empty(num_rows, h_q, d, dtype=r.compute_dtype, device=dev) for r in roundings]
    if bs == 0:
        return outs
    rows = shape.rows
    l_host, t_host, first_host = shape.l_host, shape.t_host, shape.first_host
    if host_lens is None:
        lens = seq_lens.to(device=dev, dtype=torch.long)
    else:
        lens = host_ints(t_host, dev)
    group = h_q // h_kv
    l_max = max(l_host)
    draft = draft_rows(draft_mask, bs, l_max, dev)
    k_tok, v_tok = k_pages.transpose(1, 2), v_pages.transpose(1, 2)  # [pages, ps, H_kv, D]
    tables = block_tables.to(device=dev, dtype=torch.long)
    sink_by_head = None if sinks is None else sinks.to(dev).reshape(h_kv, group)
    spans = [t - f for t, f in zip(t_host, first_host, strict=True)]
    first_key = host_ints(first_host, dev)
    uniform = min(l_host) == l_max
    # a request's largest temporaries per key: its padded scores, and its gathered K (or V)
    per_key = max(h_q * l_max, h_kv * d)
    row_start_host = [0, *itertools.accumulate(l_host[:-1])]
    for members in _chunk_plan(spans, per_key):
        live = None
        if members is None:  # every request, in order: one chunk
            pick: slice | torch.Tensor = slice(None)
            n, uniform_from = max(spans), 0 if uniform else None
        else:
            pick = host_ints(members, dev)
            n, uniform_from = max(spans[i] for i in members), None
        if uniform_from is None:
            chunk = range(bs) if members is None else members
            live = live_rows(chunk, l_host, row_start_host, l_max, dev)
        _chunk(
            k_tok,
            v_tok,
            tables[pick],
            lens[pick],
            first_key[pick],
            n,
            rows.starts[pick],
            rows.lens[pick],
            l_max,
            draft[pick],
            roundings,
            outs,
            bmm1_scale=bmm1_scale,
            bmm2_scale=bmm2_scale,
            window_left=window_left,
            sinks=sink_by_head,
            uniform_from=uniform_from,
            live=live,
        )
    return outs


@dataclass(frozen=True, slots=True)
class LiveRows:
    """Where a ragged chunk's real rows are: in its padded ``[b, l_max]`` layout (``src``,
    flat) and in the launch's packed rows (``dst``); index tensors on the device, made on the
    host from the lengths it knows (a boolean mask would make the host wait for the device
    to count it)."""

    src: torch.Tensor
    dst: torch.Tensor


def live_rows(
    chunk: Sequence[int],
    l_host: Sequence[int],
    row_start: Sequence[int],
    l_max: int,
    dev: torch.device,
) -> LiveRows:
    """The real rows of the requests ``chunk`` (launch indices, in the chunk's order), each
    request ``l_host[b]`` rows from ``row_start[b]``, in one copy."""
    src = [j * l_max + r for j, b in enumerate(chunk) for r in range(l_host[b])]
    dst = [row_start[b] + r for b in chunk for r in range(l_host[b])]
    both = host_ints(src + dst, dev)
    return LiveRows(src=both[: len(src)], dst=both[len(src) :])


def _chunk_plan(spans: Sequence[int], per_key: int) -> list[list[int] | None]:
    """The requests of each chunk: ``[None]`` (all of them, in order, as one chunk) when their
    padded temporaries (``requests * longest span * per_key`` elements) fit
    :data:`CHUNK_ELEMENTS`; else the requests by span, shortest first, cut greedily so that
    each chunk fits (a request larger than that is a chunk of its own). Each chunk pads to
    its own longest span, so requests of like length share one: a launch of many short
    requests and a few long ones pads each to its neighbours, not all to the longest."""
    if not spans or len(spans) * max(spans) * per_key <= CHUNK_ELEMENTS:
        return [None]
    plan: list[list[int] | None] = []
    current: list[int] = []
    for i in sorted(range(len(spans)), key=lambda j: spans[j]):
        if current and (len(current) + 1) * spans[i] * per_key > CHUNK_ELEMENTS:
            plan.append(current)
            current = []
        current.append(i)
    plan.append(current)
    return plan


def _chunk(
    k_tok: torch.Tensor,
    v_tok: torch.Tensor,
    table: torch.Tensor,
    t_b: torch.Tensor,
    first_key: torch.Tensor,
    n: int,
    row_starts: torch.Tensor,
    l_b: torch.Tensor,
    l_max: int,
    draft: torch.Tensor,
    roundings: Sequence[Rounding],
    outs: list[torch.Tensor],
    *,
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int,
    sinks: torch.Tensor | None,
    uniform_from: int | None,
    live: LiveRows | None,
) -> None:
    """One chunk of requests, every rounding: writes their rows of ``outs``.

    ``k_tok``/``v_tok`` are the token-major pages ``[pages, ps, H_kv, D]``; request ``b``'s keys
    are the ``n`` positions from ``first_key[b]`` (those past ``T_b`` are padding).
    ``uniform_from``: when every request has ``l_max`` rows, the first row of the chunk (its
    rows are then one contiguous block, read and written without an index); ``None``: ragged."""
    dev = t_b.device
    b_len = t_b.shape[0]
    page_size, h_kv, d = k_tok.shape[1:]
    h_q = outs[0].shape[1]
    group = h_q // h_kv
    key = first_key[:, None] + torch.arange(n, device=dev)[None, :]  # [b, t] absolute positions
    visible = visibility(key, t_b - l_b, l_b, l_max, window_left, draft)
    # Gather K/V token by token; the page id of a key past T_b is zeroed *before* the gather
    # (table columns past the used pages may hold anything, even out-of-range ids).
    in_use = key < t_b[:, None]
    pages = torch.where(in_use, torch.gather(table, 1, (key // page_size) * in_use), 0)
    slots = key % page_size
    k_raw = k_tok[pages, slots].permute(0, 2, 1, 3)  # [b, H_kv, t, D], stored dtype
    # Values no row sees are zeroed: 0 * NaN of a stale slot would leak into P @ V (a key no
    # row sees cannot leak: its score is replaced by -inf).
    seen = visible.any(dim=1)[:, None, :, None]  # [b, 1, t, 1]
    v_raw = torch.where(seen, v_tok[pages, slots].permute(0, 2, 1, 3), 0.0)
    # Query rows as [b, l, H_q, D]; padding rows read row 0 of their request (discarded).
    if uniform_from is None:
        row = torch.arange(l_max, device=dev)[None, :]
        row_index = row_starts[:, None] + torch.minimum(row, l_b[:, None] - 1)  # [b, l]
    else:
        block = slice(uniform_from, uniform_from + b_len * l_max)
    k_in: dict[torch.dtype, torch.Tensor] = {}
    v_in: dict[torch.dtype, torch.Tensor] = {}
    softmaxes: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
    k_raw_t = k_raw.transpose(-1, -2)  # [b, H_kv, D, t]: the operand of Q @ K^T
    for rounding, out in zip(roundings, outs, strict=True):
        cd = rounding.compute_dtype
        k_t, v = _upcast(k_raw_t, cd, k_in), _upcast(v_raw, cd, v_in)
        # Roundings that read the same queries in the same dtype share their scores and
        # softmax (they differ only in how P is rounded).
        shared = (id(rounding.q), cd)
        if shared not in softmaxes:
            if uniform_from is None:
                q = rounding.q[row_index].to(cd)  # [b, l, H_q, D]
            else:
                q = rounding.q[block].to(cd)
            q = q.view(b_len, l_max, h_kv, group, d).permute(0, 2, 1, 3, 4)  # [b, H_kv, l, g, D]
            s = bmm1_scale * torch.matmul(q.reshape(b_len, h_kv, l_max * group, d), k_t).view(
                b_len, h_kv, l_max, group, n
            )
            s = torch.where(visible[:, None, :, None, :], s, float("-inf"))
            softmaxes[shared] = _exp_and_denominator(s, None if sinks is None else sinks.to(cd))
        e, denom = softmaxes[shared]
        if rounding.p_dtype is None:
            p = e / denom[..., None]
            o = torch.matmul(p.view(b_len, h_kv, l_max * group, n), v)  # [b, H_kv, l*g, D]
        else:
            # the unnormalised terms rounded, divided by their unrounded sum after P @ V, as
            # the definition's rounded computation does (the largest term, 1, is exact)
            p = e.to(rounding.p_dtype).to(cd)
            o = torch.matmul(p.view(b_len, h_kv, l_max * group, n), v)
            o = o / denom.view(b_len, h_kv, l_max * group, 1)
        o = bmm2_scale * o.view(b_len, h_kv, l_max, group, d).permute(0, 2, 1, 3, 4)
        if cd == torch.float32:  # subnormal outputs flushed, as the definition does
            o = torch.where(o.abs() < torch.finfo(cd).tiny, 0.0, o)
        if uniform_from is None:
            assert live is not None
            out[live.dst] = o.reshape(b_len * l_max, h_q, d)[live.src]
        else:
            out[block].view(b_len, l_max, h_kv, group, d).copy_(o)


def _upcast(
    raw: torch.Tensor, dtype: torch.dtype, done: dict[torch.dtype, torch.Tensor]
) -> torch.Tensor:
    """``raw`` (a ``[b, H_kv, m, n]`` operand of a batched product) in ``dtype``, converted once
    per dtype (``done``: the conversions so far), laid out as ``torch.matmul`` hands it to
    ``bmm``. Its batch dims must flatten into one: where they do not (a gathered K/V is
    token-major, so its head dim lies inside its token dim), matmul would copy the operand to
    a contiguous tensor at every product; the conversion writes that tensor itself instead,
    so each product reads the same numbers in the same layout as before, without the copy.
    A float of 8 or 16 bits reaches float64 through float32, which holds each of its values
    exactly (the same numbers, and the float32 copy serves a float32 rounding too)."""
    if dtype not in done:
        narrow = raw.is_floating_point() and raw.element_size() < 4
        if dtype == torch.float64 and narrow:
            done[dtype] = _upcast(raw, torch.float32, done).to(dtype)
        elif _batch_flattens(raw):
            done[dtype] = raw.to(dtype)
        else:
            done[dtype] = torch.empty(raw.shape, dtype=dtype, device=raw.device).copy_(raw)
    return done[dtype]


def _batch_flattens(x: torch.Tensor) -> bool:
    """Whether the first two dims of ``x`` merge into one without a copy (what ``reshape``
    asks of them)."""
    return x.shape[0] <= 1 or x.shape[1] <= 1 or x.stride(0) == x.stride(1) * x.shape[1]
