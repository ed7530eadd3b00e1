"""The float64 oracle of :mod:`difftest.oracle.batched` on a CUDA device, in three Triton kernels.

The torch form of the batched oracle gathers each request's keys and values out of the pages,
upcasts them to float64 in memory (through float32), and multiplies those copies: for a GPU
case of tens of thousands of keys that is several gigabytes moved a launch, in hundreds of
kernel launches (the chunks of a long launch, each a few dozen tensor operations). Profiled on
the H200 at the default limits (docs/validation.md, Run 25), the torch form took 6.4-7.9 ms of
host time and 4.2 ms of device time a case in 735 tensor operations, most of the device time
the gathers and the upcasting copies; these kernels took 2.4 ms of host time and 1.1 ms of
device time in 124 operations (the noise floors' float32 passes included, when a launch needs
them).

Here every key is read from its page once per pass, in its stored dtype, and widened to
float64 in registers; nothing float64 of the cache's size is stored. The computation is the
definition's, in the same three steps the torch form takes:

1. **maxima**: each row's largest visible score ``s = bmm1_scale * q.k`` (float64 products and
   sums), over the keys the definition's visibility lets the row see (causal, bottom-right
   aligned; the sliding window; the draft mask among the new tokens);
2. **sums**: with the row's maximum ``m`` (joined by its sink; a row whose maximum is not
   finite takes ``m = 0``, as the definition does), the terms ``e = exp(s - m)`` (0 for an
   unseen key), their sum and ``sum e * v``, in float64;
3. **combine**: ``o = bmm2_scale * (sum e * v) / denominator``, the denominator being the row
   sum plus the sink's term (1 where it is 0: a row that sees nothing gives 0).

The work is cut into *items*: a request's keys in runs of :data:`KEYS_PER_ITEM`, so a launch
of one long request still spreads over the device. Steps 1 and 2 run one program per item,
KV head and block of query rows; step 3 adds an item's partial sums up, in item order (the
result does not depend on the run). Values no row of the request sees are read as 0, as the
torch form zeroes them (``0 * NaN`` of a stale slot would leak into the sum); scores of keys a
row does not see are replaced, never used.

Only the float64 rounding without probability rounding (the oracle itself) runs here; the
noise floors' float32 roundings keep the torch form, bit for bit as before. The result equals
the torch form's within float64 rounding (the sums are taken in another order). That is
checked, not assumed: the first call in a process computes a built-in sample both ways
(every stored dtype, a window, sinks, a draft tree, ragged rows, a long request cut in many
items); on a difference larger than float64 rounding it warns once and every later call takes
the torch form. ``tests/unit/test_oracle_fused.py`` runs the kernels under Triton's
interpreter on the CPU against the definition; ``tests/gpu/test_oracle_fused_gpu.py`` on CUDA.

Triton compiles each variant once per machine (its disk cache keeps it): one per cache dtype
and head-dim block, three kernels each, about 45 in all, each a second or less. No argument
that changes from launch to launch is specialised on (see :mod:`fused_kernels`): while the
pointers' alignment was, a GPU campaign compiled the kernels anew for most launches and ran
slower than with the torch form (Run 25).

Without Triton or off CUDA, :func:`usable` is ``False`` and the oracle takes the torch form.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from difftest.oracle.batched import (
    Rounding,
    batched_paged_attention,
    draft_rows,
    host_ints,
    launch_shape,
)

log = logging.getLogger(__name__)

ENABLED = os.environ.get("DIFFTEST_FUSED_ORACLE", "1") != "0"
"""``False`` (or ``DIFFTEST_FUSED_ORACLE=0`` in the environment, to compare the two forms
from outside): always the torch form. The check sets the fused form aside on a mismatch."""

_checked: bool | None = None
"""``None``: not checked in this process yet; then whether the two forms agreed."""

KEYS_PER_ITEM = 512
"""Keys of one request one program reads (a longer request is several items)."""

BLOCK_M = 16
"""Query rows of a program: ``(row, head in the group)`` pairs of one KV head (rows past a
head's ``L_max * group`` are padding; 16 is the least a float64 ``tl.dot`` takes)."""

AGREEMENT = 1e-12
"""The self-check's allowance, relative to the sample's largest output: float64 rounding of
sums over at most a few thousand terms, with a wide margin (a real mistake is far larger)."""

NO_WINDOW = 2**40
"""The reach of a row without a sliding window: more keys than any cache holds."""

_KINDS = {
    torch.float16: 0,
    torch.float32: 0,
    torch.float64: 0,
    torch.bfloat16: 1,
    torch.float8_e4m3fn: 2,
}
"""How a stored dtype reaches float64: read natively, or as bits (bf16 as int16, fp8 e4m3 as
uint8) widened exactly by integer arithmetic (independent of Triton's 8- and 16-bit float
support, and the same under its interpreter)."""

_BITS = {1: torch.int16, 2: torch.uint8}

_kernels: dict[str, Any] | None = None


def usable(device: torch.device) -> bool:
    """Whether the oracle may run fused on ``device`` (CUDA, Triton, not set aside)."""
    return ENABLED and device.type == "cuda" and _checked is not False and _have_triton()


def _have_triton() -> bool:
    """Whether Triton is installed (imported only when the kernels are built)."""
    return importlib.util.find_spec("triton") is not None


def float_bits(x: float) -> int:
    """A float64's bit pattern as a signed int64: how a float64 reaches a kernel exactly (a
    Python float argument would be passed as a float32)."""
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def takes(k_pages: torch.Tensor) -> bool:
    """Whether the kernels read this cache's dtype."""
    return k_pages.dtype in _KINDS


def batched_attention(
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
    use_fused: bool | None = None,
) -> list[torch.Tensor]:
    """:func:`~difftest.oracle.batched.batched_paged_attention` (same arguments, same
    outputs), its float64 roundings without probability rounding computed by the kernels here.
    ``use_fused``: ``None`` (the default) where :func:`usable` and :func:`checked`; ``True``
    always (a test running them under Triton's interpreter); ``False`` never. The other
    roundings (the noise floors' float32 ones) take the torch form."""
    kwargs: dict[str, Any] = dict(
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        window_left=window_left,
        sinks=sinks,
        draft_mask=draft_mask,
    )
    fast = _fused_roundings(roundings, k_pages, use_fused)
    args = (k_pages, v_pages, block_tables, seq_lens, q_lens)
    if not fast:
        return batched_paged_attention(*args, roundings, **kwargs)
    shape = launch_shape(*args, roundings, window_left)
    rest = [r for i, r in enumerate(roundings) if i not in fast]
    slow = iter(batched_paged_attention(*args, rest, **kwargs) if rest else [])
    bs, l_max = len(shape.l_host), max(shape.l_host, default=0)
    draft = None
    if draft_mask is not None and bs:
        draft = draft_rows(draft_mask, bs, l_max, k_pages.device)
    return [
        paged_attention(
            k_pages,
            v_pages,
            block_tables,
            r.q,
            t_host=shape.t_host,
            l_host=shape.l_host,
            first_host=shape.first_host,
            bmm1_scale=bmm1_scale,
            bmm2_scale=bmm2_scale,
            window_left=window_left,
            sinks=sinks,
            draft=draft,
        )
        if i in fast
        else next(slow)
        for i, r in enumerate(roundings)
    ]


def _fused_roundings(
    roundings: Sequence[Rounding], k_pages: torch.Tensor, use_fused: bool | None
) -> list[int]:
    """Which roundings the kernels compute: the float64 ones without probability rounding,
    where they may run."""
    if use_fused is False or not roundings or not takes(k_pages):
        return []
    dev = roundings[0].q.device
    if use_fused is None and not (usable(dev) and checked(dev)):
        return []
    return [
        i for i, r in enumerate(roundings) if r.compute_dtype == torch.float64 and r.p_dtype is None
    ]


def paged_attention(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    q: torch.Tensor,
    *,
    t_host: Sequence[int],
    l_host: Sequence[int],
    first_host: Sequence[int],
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int,
    sinks: torch.Tensor | None,
    draft: torch.Tensor | None,
) -> torch.Tensor:
    """The float64 oracle's ``[R, H_q, D]`` output, as
    :func:`difftest.oracle.batched.batched_paged_attention` defines it for a rounding of
    ``compute_dtype=float64, p_dtype=None``.

    The caller has checked the shapes and passes the host's view of them: ``t_host`` (``T_b``),
    ``l_host`` (``L_b``, rows packed request after request), ``first_host`` (each request's
    first key any row sees). ``draft``: the ``[bs, L_max, L_max]`` draft mask, or ``None`` for
    a chain (whose visibility is the causal one)."""
    kernels = _build()
    dev = q.device
    num_rows, h_q, d = q.shape
    _, h_kv, page_size, _ = k_pages.shape
    group = h_q // h_kv
    bs = len(t_host)
    out = torch.empty(num_rows, h_q, d, dtype=torch.float64, device=dev)
    if bs == 0 or num_rows == 0:
        return out
    l_max = max(l_host)
    # the items, and what each request and item needs, in one host-to-device copy
    req_cols: list[list[int]] = [[], [], [], [], []]  # T_b, L_b, row start, first item, items
    item_req: list[int] = []
    item_key0: list[int] = []
    row = 0
    for b, (t, n, first) in enumerate(zip(t_host, l_host, first_host, strict=True)):
        count = -(-(t - first) // KEYS_PER_ITEM) if n > 0 else 0
        for col, value in zip(req_cols, (t, n, row, len(item_req), count), strict=True):
            col.append(value)
        item_req += [b] * count
        item_key0 += range(first, first + count * KEYS_PER_ITEM, KEYS_PER_ITEM)
        row += n
    n_items = len(item_req)
    if n_items == 0:
        return out.zero_()
    reach = window_left if window_left >= 0 else NO_WINDOW
    flat = [v for col in req_cols for v in col] + item_req + item_key0 + [reach]
    packed = host_ints(flat, dev)
    t_b, l_b, row_start, item_first, item_count = packed[: 5 * bs].view(5, bs)
    item_b = packed[5 * bs : 5 * bs + n_items]
    key0 = packed[5 * bs + n_items : 5 * bs + 2 * n_items]
    window = packed[-1:]  # in memory: an int argument would compile a variant per size

    q64 = q.to(torch.float64).contiguous()
    kind = _KINDS[k_pages.dtype]
    k_src = k_pages.view(_BITS[kind]) if kind in _BITS else k_pages
    v_src = v_pages.view(_BITS[kind]) if kind in _BITS else v_pages
    table = block_tables.to(dev)
    sink = (
        sinks.to(device=dev, dtype=torch.float64).reshape(-1).contiguous()
        if sinks is not None
        else q64.new_zeros(1)
    )
    if draft is not None:
        mask = draft.to(device=dev, dtype=torch.bool).expand(bs, l_max, l_max)
        seen_cols = _columns_seen(mask, l_b, l_max, window_left)
        draft_u8 = mask.contiguous().view(torch.uint8)
        seen_u8 = seen_cols.contiguous().view(torch.uint8)
    else:
        draft_u8 = seen_u8 = torch.ones(1, dtype=torch.uint8, device=dev)
    blocks = block_sizes(d)
    n_mb = -(-(l_max * group) // BLOCK_M)
    m_pad = n_mb * BLOCK_M
    m_part = torch.empty(n_items, h_kv, m_pad, dtype=torch.float64, device=dev)
    l_part = torch.empty_like(m_part)
    acc_part = torch.empty(n_items, h_kv, m_pad, blocks.d, dtype=torch.float64, device=dev)
    # what every kernel reads of the requests and rows
    rows = dict(
        t_ptr=t_b,
        l_ptr=l_b,
        row0_ptr=row_start,
        sink_ptr=sink,
        item_first_ptr=item_first,
        item_count_ptr=item_count,
        m_part_ptr=m_part,
        h_q=h_q,
        h_kv=h_kv,
        group=group,
        d=d,
        has_sink=int(sinks is not None),
        n_mb=n_mb,
        BLOCK_M=BLOCK_M,
        BLOCK_D=blocks.d,
        num_warps=blocks.warps,
    )
    common = dict(
        q_ptr=q64,
        k_ptr=k_src,
        v_ptr=v_src,
        table_ptr=table,
        draft_ptr=draft_u8,
        colseen_ptr=seen_u8,
        page_size=page_size,
        l_max=l_max,
        s_kp=k_pages.stride(0),
        s_kh=k_pages.stride(1),
        s_ks=k_pages.stride(2),
        s_kd=k_pages.stride(3),
        s_vp=v_pages.stride(0),
        s_vh=v_pages.stride(1),
        s_vs=v_pages.stride(2),
        s_vd=v_pages.stride(3),
        s_tb=table.stride(0),
        s_tc=table.stride(1),
        window_ptr=window,
        has_draft=int(draft is not None),
        bmm1_bits=float_bits(float(bmm1_scale)),
        KIND=kind,
        BLOCK_N=blocks.n,
        KEYS=KEYS_PER_ITEM,
        OPAQUE=q.device.type == "cuda",
        **rows,
    )
    grid = (n_items, h_kv * n_mb)
    kernels["maxima"][grid](item_b_ptr=item_b, key0_ptr=key0, **common)
    kernels["sums"][grid](
        item_b_ptr=item_b, key0_ptr=key0, l_part_ptr=l_part, acc_part_ptr=acc_part, **common
    )
    kernels["combine"][(bs, h_kv * n_mb)](
        l_part_ptr=l_part,
        acc_part_ptr=acc_part,
        out_ptr=out,
        bmm2_bits=float_bits(float(bmm2_scale)),
        **rows,
    )
    return out


@dataclass(frozen=True, slots=True)
class Blocks:
    """A launch's block sizes (powers of two, at least 16: what a float64 ``tl.dot`` takes):
    ``d`` the head dim padded, ``n`` the keys of a step, ``warps`` a program's warps."""

    d: int
    n: int
    warps: int


def block_sizes(d: int) -> Blocks:
    """Block sizes for head dim ``d``: a step's ``[keys, dims]`` tile of K or V holds 4,096
    float64 values (32 a thread), and a program of :data:`BLOCK_M` rows."""
    dp = max(16, 1 << (d - 1).bit_length())
    return Blocks(d=dp, n=max(16, 4096 // dp), warps=4 if dp <= 128 else 8)


def _columns_seen(
    mask: torch.Tensor, l_b: torch.Tensor, l_max: int, window_left: int
) -> torch.Tensor:
    """``[bs, L_max]``: whether some row of the request sees its new token ``m`` (row ``l``
    does when ``m <= l < L_b``, its draft row allows it, and ``l - m`` is within the window):
    the values of the others are read as 0, as the torch form's ``visible.any`` zeroes them."""
    idx = torch.arange(l_max, device=mask.device)
    ok = (idx[:, None] >= idx[None, :])[None] & (idx[None, :, None] < l_b[:, None, None])
    if window_left >= 0:
        ok = ok & ((idx[:, None] - idx[None, :]) <= window_left)[None]
    return (mask & ok).any(dim=1)


def _build() -> dict[str, Any]:
    """The kernels, imported on first use (Triton's JIT builds each variant when first run)."""
    global _kernels
    if _kernels is None:
        if not _have_triton():
            raise RuntimeError("the fused oracle needs Triton")
        fused_kernels = importlib.import_module("difftest.oracle.fused_kernels")
        _kernels = {
            "maxima": fused_kernels.maxima,
            "sums": fused_kernels.sums,
            "combine": fused_kernels.combine,
        }
    return _kernels


def checked(device: torch.device) -> bool:
    """Whether the fused form agrees with the torch form
    (:func:`~difftest.oracle.batched.batched_paged_attention`) on this process's built-in
    sample; computed on the first call, then remembered. A difference, or the kernels failing
    to build, warns once and sets the fused form aside."""
    global _checked
    if _checked is None:
        try:
            _checked = _agrees(device)
            if not _checked:
                log.warning(
                    "the fused oracle disagrees with the torch form on its check sample: "
                    "using the torch form"
                )
        except Exception as exc:  # a Triton or driver that cannot build them
            log.warning("fused oracle unavailable (%s: %s)", type(exc).__name__, exc)
            _checked = False
    return _checked


def _agrees(device: torch.device) -> bool:
    gen = torch.Generator().manual_seed(20261204)
    for dtype, d, window, with_sink, tree in (
        (torch.bfloat16, 64, -1, False, False),
        (torch.float16, 80, 700, True, True),
        (torch.float8_e4m3fn, 128, -1, True, False),
        (torch.float32, 16, 3, False, True),
    ):
        h_kv, group, page_size, pages = 2, 3, 16, 400
        lens = [3, 1, 4, 2]
        seq = [1300, 1, 37, 600]
        k = torch.randn(pages, h_kv, page_size, d, generator=gen).to(dtype)
        v = torch.randn(pages, h_kv, page_size, d, generator=gen).to(dtype)
        table = torch.randperm(pages, generator=gen)[: 4 * 90].view(4, 90).to(torch.int32)
        q = torch.randn(sum(lens), h_kv * group, d, generator=gen, dtype=torch.float64)
        sinks = torch.randn(h_kv * group, generator=gen) if with_sink else None
        draft = None
        if tree:
            draft = torch.rand(4, 4, 4, generator=gen) < 0.5
            draft |= torch.eye(4, dtype=torch.bool)
            draft = draft.tril()
        k_d, v_d, table_d, seq_d = (x.to(device) for x in (k, v, table, torch.tensor(seq)))
        kwargs: dict[str, Any] = dict(
            bmm1_scale=0.11,
            bmm2_scale=1.5,
            window_left=window,
            sinks=None if sinks is None else sinks.to(device),
            draft_mask=None if draft is None else draft.to(device),
        )
        roundings = [Rounding(q.to(device))]
        launch = (k_d, v_d, table_d, seq_d, lens, roundings)
        want = batched_paged_attention(*launch, **kwargs)[0]
        got = batched_attention(*launch, use_fused=True, **kwargs)[0]
        scale = float(want.abs().max())
        if not bool(((got - want).abs() <= AGREEMENT * scale).all()):
            return False
    return True
