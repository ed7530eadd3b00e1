"""The Triton kernels of :mod:`difftest.oracle.fused` (imported only where Triton is; the
module that launches them says what they compute and how they are checked).

Dimension names as in :mod:`difftest.oracle.batched`. A program's rows ``r`` are ``(row, head
in the group)`` pairs of one KV head, row-major: ``lq = r // group`` is the row's index among
its request's new tokens, ``head = h * group + r % group`` its query head.

The products are float64 ``tl.dot`` s. A cache tile widened from 8 or 16 bits passes through
:func:`opaque` (an identity the compiler cannot see through) before its product: otherwise
Triton folds the widening into the product's operand layout, which its float64 matrix-multiply
lowering does not support ("fp64 don't support largeK MMA", an assertion in Triton 3.6, the
H200 machine's; 3.9 compiles it). Under Triton's interpreter (the CPU tests) ``OPAQUE`` is off:
it runs no inline assembly, and needs none.

With ``F32`` set, the same programs compute a noise floor's rounding instead: float32 tiles,
the scores a float32 ``tl.dot`` in IEEE arithmetic (``input_precision="ieee"``: never TF32),
subnormal terms and outputs flushed, and each term ``exp(s - m)`` rounded to the probability
dtype by :func:`rounded` before its product with V (its unrounded sum is the denominator), as
:func:`difftest.oracle.batched._chunk` computes it. That product is not a ``tl.dot`` but
:func:`weighted32`, float32 multiplies and a sum over the step's keys: as a ``tl.dot``, Triton
3.6 rebuilt the terms' whole computation in the product's operand layout and failed an
assertion lowering it (``applyLinearLayout``, for sm90, with a cache read as bits: bf16 and
fp8; docs/validation.md, Runs 33-35). Its steps are shorter (:func:`difftest.oracle.fused.
block_sizes`), as a step's ``[rows, keys, dims]`` products are held at once. The probability
dtype is a runtime argument (its mantissa bits, least exponent, largest value): one compiled
variant serves every precision.

A key's page column and slot are 32-bit arithmetic (as 64-bit, each key's division by the
page size was a long subroutine), and with ``ALIGNED`` (:func:`difftest.oracle.fused.aligned`,
true for every launch a campaign packs) the rows' offsets are marked multiples of 16 elements
(:func:`row_offsets`) and the cache's pointers are specialised on alignment, so that a row is
read 16 bytes at a time (asynchronous copies Triton pipelines through shared memory) instead
of an element at a time. For the bf16 one pass at head dim 128 that halved the machine code
(sm90: 3,336 instructions against 6,528), but on an H100 it made the oracle 0.90 of the time
on one set of launches and no faster on a mix of shapes: the kernels are latency-bound at two
warps a scheduler (255 registers a thread; Nsight Compute, docs/validation.md Run 41).
"""

from __future__ import annotations

import triton
import triton.language as tl


def _runtime(*names: str) -> dict[str, list[str]]:
    """``triton.jit``'s arguments for kernel arguments it must not specialise on: not on an
    integer's value (1, or divisible by 16) and not on a pointer's 16-byte alignment. Each
    specialisation is a compile of its own, and these values change from launch to launch (a
    slice of the launch's packed index tensor is aligned or not by the batch size's parity): a
    GPU campaign compiled the kernels again and again (docs/validation.md, Run 25). What is
    left to tell variants apart is the cache's dtype and the compile-time block sizes.

    The cache's two pointers are the exception: they are specialised on alignment, which is
    what lets :func:`cache_rows` read 16 bytes at a time. They point at a launch's pool and
    its V half, aligned in every launch a campaign makes, so this adds no compile there."""
    aligned = [n for n in names if n not in CACHE_POINTERS]
    return {"do_not_specialize": list(names), "do_not_specialize_on_alignment": aligned}


CACHE_POINTERS = ("k_ptr", "v_ptr")


_STEP_ARGS = (
    "q_ptr", "k_ptr", "v_ptr", "table_ptr", "t_ptr", "l_ptr", "row0_ptr", "draft_ptr",
    "colseen_ptr", "sink_ptr", "item_first_ptr", "item_count_ptr", "m_part_ptr", "item_b_ptr",
    "key0_ptr", "window_ptr", "h_q", "h_kv", "group", "d", "page_size", "l_max", "s_kp",
    "s_kh", "s_ks", "s_vp", "s_vh", "s_vs", "s_tb", "s_tc", "has_draft",
    "has_sink", "bmm1_bits", "n_mb",
)  # fmt: skip


@triton.jit
def widen(raw, KIND: tl.constexpr, F32: tl.constexpr):
    """A loaded tile of the cache as float64 (``F32``: float32), exactly (a float64 cache
    read as float32 is rounded to nearest, as the torch form's conversion rounds it)."""
    if KIND == 0:
        if F32:
            x = raw.to(tl.float32)
        else:
            x = raw.to(tl.float64)
    elif KIND == 1:  # bf16: its bits are a float32's upper half
        bits = (raw.to(tl.int32) & 0xFFFF) << 16
        x = bits.to(tl.float32, bitcast=True)
        if not F32:
            x = x.to(tl.float64)
    else:  # fp8 e4m3fn: sign, 4 exponent bits e (bias 7), 3 mantissa bits m; no inf
        # The 7 bits below the sign put at the top of a float64's exponent and mantissa
        # (exponent field e, mantissa m << 49) are 2**(e - 1023) * (1 + m / 8), or for e = 0
        # the subnormal 2**-1022 * m / 8; times 2**1016 (exact: a power of two, in range)
        # those are e4m3's 2**(e - 7) * (1 + m / 8) and 2**-6 * m / 8. The sign bit is the
        # float64's; 0x7f and 0xff are a NaN (its sign not kept). Only the upper 32 bits are
        # built: the lower are 0. (Until docs/validation.md Run 50 each field was taken
        # apart and the value rebuilt in float64 arithmetic, which made the fp8 steps' loop
        # 1.2-2.4 times the bf16 steps' machine code (sm_90); this makes it 1.1-1.3 times.)
        b = raw.to(tl.int32) & 0xFF
        high = ((b & 127) << 17) | ((b & 128) << 24)  # the float64's upper 32 bits
        high = tl.where((b & 127) == 127, 0x7FF80000, high)  # NaN (times 2**1016: NaN)
        bits = high.to(tl.int64) << 32
        scale = tl.full(bits.shape, (1016 + 1023) << 52, tl.int64).to(tl.float64, bitcast=True)
        x = bits.to(tl.float64, bitcast=True) * scale
        if F32:  # every e4m3 value is a float32
            x = x.to(tl.float32)
    return x


@triton.jit
def computed(x, F32: tl.constexpr):
    """``x`` in the compute dtype: float32 when ``F32``, else as it is (float64)."""
    if F32:
        x = x.to(tl.float32)
    return x


@triton.jit
def product(a, b, F32: tl.constexpr):
    """``a @ b`` in the compute dtype; float32 in IEEE arithmetic (Triton's default for a
    float32 ``tl.dot`` is TF32, whose 10-bit mantissa a noise floor must not see)."""
    if F32:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def weighted32(e, v, OPAQUE: tl.constexpr):
    """``e @ v`` in float32, IEEE: each product rounded, then summed over the keys (the
    middle axis). Not a ``tl.dot`` (see above). With ``OPAQUE`` the products pass through an
    inline ``mov.b32``, which keeps Triton from recognising a multiply-and-sum as a product
    and making it a ``tl.dot`` again (in TF32 for some tile shapes); the interpreter runs
    no inline assembly and makes no such change."""
    terms = e[:, :, None] * v[None, :, :]
    if OPAQUE:
        terms = tl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r", [terms], dtype=tl.float32, is_pure=True, pack=1
        )
    return tl.sum(terms, axis=1)


@triton.jit
def flushed(x):
    """``x`` with float32 subnormals flushed to 0, as the definition's float32 rounding does
    (NaN kept)."""
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, 0.0, x)


@triton.jit
def rounded(e, p_mbits, p_emin, p_max_bits, p_over_bits):
    """Non-negative float32 terms ``e`` rounded to nearest even in a float format of
    ``p_mbits`` mantissa bits (0: not rounded, ``e`` returned) and least normal exponent
    ``p_emin`` (subnormals below it), as float32: what ``e.to(p_dtype).to(float32)`` gives
    in torch. A value past the format's largest, ``p_max`` (float64 bits), or infinite
    becomes ``p_over`` (float64 bits: inf, NaN for a format without inf, or the largest
    where torch saturates); NaN stays NaN.

    Integer arithmetic on the bits: the significand ``sig`` (implicit bit included) is cut
    to the format's quantum at the value's exponent, ``2 ** (max(u, p_emin) - p_mbits)``,
    with ties to even, and ``k`` quanta are rebuilt exactly as ``k * 2**hi * 2**lo``."""
    bits = e.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    u = tl.where(field == 0, -126, field - 127)  # a subnormal's exponent, without its bit
    sig = tl.where(field == 0, bits & 0x7FFFFF, (bits & 0x7FFFFF) | 0x800000)
    r = tl.minimum((23 - p_mbits) + tl.maximum(p_emin - u, 0), 25)
    k = (sig + ((1 << (r - 1)) - 1) + ((sig >> r) & 1)) >> r
    se = tl.minimum(tl.maximum(u, p_emin) - p_mbits, 127)  # the quantum's exponent
    hi = ((tl.maximum(se, -126) + 127) << 23).to(tl.float32, bitcast=True)
    lo = ((tl.minimum(se + 126, 0) + 127) << 23).to(tl.float32, bitcast=True)
    p = k.to(tl.float32) * hi * lo
    top = p_max_bits.to(tl.int64).to(tl.float64, bitcast=True).to(tl.float32)
    over = p_over_bits.to(tl.int64).to(tl.float64, bitcast=True).to(tl.float32)
    p = tl.where(p > top, over, p)  # an infinite e too: its p is past the largest
    p = tl.where(e != e, e, p)
    return tl.where(p_mbits > 0, p, e)


@triton.jit
def opaque(x, OPAQUE: tl.constexpr, F32: tl.constexpr):
    """``x`` unchanged, through an instruction the compiler does not look into (see above;
    float64 only: it does not keep float32 operands out of a product's operand layout, which
    is why the float32 product with V is :func:`weighted32`)."""
    if OPAQUE and not F32:
        x = tl.inline_asm_elementwise(
            "mov.b64 $0, $1;", "=d,d", [x], dtype=tl.float64, is_pure=False, pack=1
        )
    return x


@triton.jit
def rows_of(
    r, b, t_ptr, l_ptr, row0_ptr, h, group, h_q, d,
):  # fmt: skip
    """A program's rows: whether each is a real row, its query head, where its query (and
    output) row starts in ``[R, H_q, D]``, and its position (``T_b - L_b + lq``)."""
    t = tl.load(t_ptr + b)
    n = tl.load(l_ptr + b)
    lq = r // group
    rows_ok = lq < n
    head = h * group + r % group
    base = ((tl.load(row0_ptr + b) + lq).to(tl.int64) * h_q + head) * d
    first_new = t - n
    return rows_ok, head, base, lq, first_new, first_new + lq


@triton.jit
def row_offsets(page, h, within, s_page, s_head, s_slot, ALIGNED: tl.constexpr):
    """Where the keys' rows of KV head ``h`` start in the cache, in elements (``page``: each
    key's page, ``within``: its slot there). ``ALIGNED`` marks each a multiple of 16, which
    the launch guarantees then; the mark must be set where the offsets are computed (on a
    function's argument Triton drops it)."""
    offs = page.to(tl.int64) * s_page + h * s_head + within * s_slot
    if ALIGNED:
        offs = tl.multiple_of(offs, 16)
    return offs


@triton.jit
def cache_rows(ptr, offs, ok, d, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr):
    """``[len(offs), BLOCK_D]`` values of the cache as stored: the rows at element offsets
    ``offs`` from ``ptr``, 0 in rows not ``ok`` and past the head dim ``d``. ``ALIGNED``: the
    launch guarantees every offset and ``d`` multiples of 16 elements and ``ptr`` 16-byte
    aligned (:func:`difftest.oracle.fused.aligned`; the offsets' mark is :func:`row_offsets`'),
    so the compiler may read 16 bytes an instruction; else each element is read alone."""
    dims = tl.arange(0, BLOCK_D)
    if ALIGNED:  # d is a multiple of 16: said so, the mask is the same over runs of 16 dims
        inside = ok[:, None] & (dims[None, :] < (d // 16) * 16)
    else:
        inside = ok[:, None] & (dims[None, :] < d)
    return tl.load(ptr + offs[:, None] + dims[None, :], mask=inside, other=0)


@triton.jit
def key_places(keys, key_end, table_ptr, b, page_size, s_tb, s_tc):
    """Which of a block of keys of request ``b`` are read (before ``key_end``), each one's
    page and its slot there."""
    in_use = keys < key_end
    # a key's page column and slot in 32 bits: a 64-bit division is a long subroutine
    k32 = keys.to(tl.int32)
    column = k32 // page_size
    within = k32 - column * page_size
    page = tl.load(table_ptr + b * s_tb + column * s_tc, mask=in_use, other=0)
    return in_use, page, within


@triton.jit
def head_scores(
    q, k_ptr, page, within, in_use, h, d, s_kp, s_kh, s_ks,
    KIND: tl.constexpr, BLOCK_D: tl.constexpr, OPAQUE: tl.constexpr, F32: tl.constexpr,
    ALIGNED: tl.constexpr,
):  # fmt: skip
    """``q.k`` of every row with each of the keys (their pages and slots) in KV head ``h``:
    ``[BLOCK_M, keys]``, not scaled."""
    offs = row_offsets(page, h, within, s_kp, s_kh, s_ks, ALIGNED)
    k_raw = cache_rows(k_ptr, offs, in_use, d, BLOCK_D, ALIGNED)
    return product(q, tl.trans(opaque(widen(k_raw, KIND, F32), OPAQUE, F32)), F32)


@triton.jit
def visible(keys, in_use, m, pos, rows_ok, lq, window_reach, has_draft, draft_at, l_max):
    """Which keys each row sees: ``keys``, ``in_use`` and ``m`` (the keys' indices among the
    new tokens, negative in the prefix) the same for every row (``[1, keys]``) or each
    row's own (``[BLOCK_M, keys]``); ``draft_at`` where the rows' request's draft mask
    starts (one request's, or each row's)."""
    seen = rows_ok[:, None] & in_use & (keys <= pos[:, None])
    seen = seen & (keys >= pos[:, None] - window_reach)
    if has_draft:
        allowed = tl.load(draft_at + lq[:, None] * l_max + m, mask=seen & (m >= 0), other=1)
        seen = seen & (allowed != 0)
    return seen


@triton.jit
def scores(
    q, k_ptr, table_ptr, b, h, keys, key_end, pos, rows_ok, lq, first_new,
    d, page_size, s_kp, s_kh, s_ks, s_tb, s_tc, window_reach, has_draft, draft_ptr,
    l_max, bmm1_scale, KIND: tl.constexpr, BLOCK_D: tl.constexpr, OPAQUE: tl.constexpr,
    F32: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """The scores ``bmm1_scale * q.k`` of one block of keys (``q``: the rows' queries,
    ``[BLOCK_M, BLOCK_D]`` in the compute dtype), and which of them each row sees; also the
    keys' pages, their slots there and their indices among the new tokens."""
    in_use, page, within = key_places(keys, key_end, table_ptr, b, page_size, s_tb, s_tc)
    s = head_scores(
        q, k_ptr, page, within, in_use, h, d, s_kp, s_kh, s_ks, KIND, BLOCK_D, OPAQUE, F32,
        ALIGNED,
    )  # fmt: skip
    s = s * bmm1_scale
    m = keys - first_new  # index among the new tokens, negative in the prefix
    seen = visible(
        keys[None, :], in_use[None, :], m[None, :], pos, rows_ok, lq, window_reach,
        has_draft, draft_ptr + b * l_max * l_max, l_max,
    )  # fmt: skip
    return s, seen, in_use, page, within, m


@triton.jit
def values(
    v_ptr, colseen_ptr, b, h, in_use, page, within, m, d, l_max,
    s_vp, s_vh, s_vs, has_draft, BLOCK_D: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """The block of keys' value rows ``[BLOCK_N, BLOCK_D]``, as stored (``page``, ``within``
    and ``m`` as :func:`scores` gives them); the values no row of the request sees are read as 0 (a
    stale slot's NaN would leak into the sum: ``0 * NaN``)."""
    v_ok = in_use
    if has_draft:
        col = tl.load(colseen_ptr + b * l_max + m, mask=in_use & (m >= 0), other=1)
        v_ok = v_ok & (col != 0)
    v_offs = row_offsets(page, h, within, s_vp, s_vh, s_vs, ALIGNED)
    return cache_rows(v_ptr, v_offs, v_ok, d, BLOCK_D, ALIGNED)


@triton.jit
def program_rows(n_mb, BLOCK_M: tl.constexpr):
    """A program of steps 1 and 2: its item, its KV head and its block of rows ``r``."""
    h = tl.program_id(1) // n_mb
    r = (tl.program_id(1) % n_mb) * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.program_id(0), h, r


@triton.jit
def item_setup(
    q_ptr, t_ptr, l_ptr, row0_ptr, item_b_ptr, key0_ptr, window_ptr, item, h, r,
    group, h_q, d, BLOCK_D: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    """What a program of steps 1 and 2 works on: its request, its keys ``[start,
    key_end)``, its rows (:func:`rows_of`), their queries ``[BLOCK_M, BLOCK_D]`` in the
    compute dtype (0 past the head dim and in padding rows) and the window's reach."""
    b = tl.load(item_b_ptr + item)
    start = tl.load(key0_ptr + item)
    rows_ok, head, q_base, lq, first_new, pos = rows_of(
        r, b, t_ptr, l_ptr, row0_ptr, h, group, h_q, d
    )
    key_end = tl.minimum(start + KEYS, tl.load(t_ptr + b))
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + q_base[:, None] + dims[None, :],
        mask=rows_ok[:, None] & (dims[None, :] < d),
        other=0.0,
    )
    return b, start, key_end, rows_ok, head, lq, first_new, pos, q, tl.load(window_ptr)


@triton.jit
def row_max(
    m_part_ptr, item_first_ptr, item_count_ptr, sink_ptr, b, h, r, rows_ok, head,
    h_kv, has_sink, M_PAD, F32: tl.constexpr,
):  # fmt: skip
    """A row's maximum over all its request's items, joined by its sink; 0 if not finite
    (the definition's rule: a row that sees nothing, or an infinite score)."""
    first = tl.load(item_first_ptr + b)
    count = tl.load(item_count_ptr + b)
    mx = computed(tl.full(r.shape, float("-inf"), tl.float64), F32)
    for j in range(count):
        part = tl.load(
            m_part_ptr + ((first + j) * h_kv + h) * M_PAD + r, mask=rows_ok, other=float("-inf")
        )
        mx = tl.maximum(mx, part)
    if has_sink:
        mx = tl.maximum(mx, tl.load(sink_ptr + head, mask=rows_ok, other=float("-inf")))
    finite = (mx == mx) & (tl.abs(mx) != float("inf"))
    return tl.where(finite, mx, 0.0)


@triton.jit(**_runtime(*_STEP_ARGS))
def maxima(
    q_ptr, k_ptr, v_ptr, table_ptr, t_ptr, l_ptr, row0_ptr, draft_ptr, colseen_ptr,
    sink_ptr, item_first_ptr, item_count_ptr, m_part_ptr, item_b_ptr, key0_ptr,
    h_q, h_kv, group, d, page_size, l_max, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs,
    s_tb, s_tc, window_ptr, has_draft, has_sink, bmm1_bits, n_mb,
    KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, KEYS: tl.constexpr, OPAQUE: tl.constexpr, F32: tl.constexpr,
    ALIGNED: tl.constexpr,
):  # fmt: skip
    """Step 1, one program per (item, KV head, block of rows): each row's largest visible
    score over the item's keys (``-inf`` if it sees none of them)."""
    item, h, r = program_rows(n_mb, BLOCK_M)
    b, start, key_end, rows_ok, _head, lq, first_new, pos, q, window_reach = item_setup(
        q_ptr, t_ptr, l_ptr, row0_ptr, item_b_ptr, key0_ptr, window_ptr, item, h, r,
        group, h_q, d, BLOCK_D, KEYS,
    )  # fmt: skip
    bmm1_scale = computed(bmm1_bits.to(tl.int64).to(tl.float64, bitcast=True), F32)
    mx = computed(tl.full([BLOCK_M], float("-inf"), tl.float64), F32)
    for n0 in range(start, key_end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        s, seen, _in_use, _page, _within, _m = scores(
            q, k_ptr, table_ptr, b, h, keys, key_end, pos, rows_ok, lq, first_new,
            d, page_size, s_kp, s_kh, s_ks, s_tb, s_tc, window_reach, has_draft,
            draft_ptr, l_max, bmm1_scale, KIND, BLOCK_D, OPAQUE, F32, ALIGNED,
        )  # fmt: skip
        mx = tl.maximum(mx, tl.max(tl.where(seen, s, float("-inf")), axis=1))
    tl.store(m_part_ptr + (item * h_kv + h) * (n_mb * BLOCK_M) + r, mx)


_P_ARGS = ("p_mbits", "p_emin", "p_max_bits", "p_over_bits")


@triton.jit(**_runtime(*_STEP_ARGS, "l_part_ptr", "acc_part_ptr", *_P_ARGS))
def sums(
    q_ptr, k_ptr, v_ptr, table_ptr, t_ptr, l_ptr, row0_ptr, draft_ptr, colseen_ptr,
    sink_ptr, item_first_ptr, item_count_ptr, m_part_ptr, item_b_ptr, key0_ptr,
    l_part_ptr, acc_part_ptr,
    h_q, h_kv, group, d, page_size, l_max, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs,
    s_tb, s_tc, window_ptr, has_draft, has_sink, bmm1_bits, n_mb,
    p_mbits, p_emin, p_max_bits, p_over_bits,
    KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, KEYS: tl.constexpr, OPAQUE: tl.constexpr, F32: tl.constexpr,
    ALIGNED: tl.constexpr,
):  # fmt: skip
    """Step 2, the same programs: with each row's maximum over the whole request, the item's
    ``sum exp(s - m)`` and ``sum exp(s - m) * v`` (``F32``: the terms flushed, and rounded
    to the probability dtype in the product with V)."""
    item, h, r = program_rows(n_mb, BLOCK_M)
    b, start, key_end, rows_ok, head, lq, first_new, pos, q, window_reach = item_setup(
        q_ptr, t_ptr, l_ptr, row0_ptr, item_b_ptr, key0_ptr, window_ptr, item, h, r,
        group, h_q, d, BLOCK_D, KEYS,
    )  # fmt: skip
    bmm1_scale = computed(bmm1_bits.to(tl.int64).to(tl.float64, bitcast=True), F32)
    dims = tl.arange(0, BLOCK_D)
    M_PAD = n_mb * BLOCK_M
    mx = row_max(
        m_part_ptr, item_first_ptr, item_count_ptr, sink_ptr, b, h, r, rows_ok, head,
        h_kv, has_sink, M_PAD, F32,
    )  # fmt: skip
    total = computed(tl.zeros([BLOCK_M], tl.float64), F32)
    acc = computed(tl.zeros([BLOCK_M, BLOCK_D], tl.float64), F32)
    for n0 in range(start, key_end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        s, seen, in_use, page, within, m = scores(
            q, k_ptr, table_ptr, b, h, keys, key_end, pos, rows_ok, lq, first_new,
            d, page_size, s_kp, s_kh, s_ks, s_tb, s_tc, window_reach, has_draft,
            draft_ptr, l_max, bmm1_scale, KIND, BLOCK_D, OPAQUE, F32, ALIGNED,
        )  # fmt: skip
        e = tl.exp(tl.where(seen, s - mx[:, None], float("-inf")))  # 0 where unseen
        if F32:
            e = flushed(e)
        total += tl.sum(e, axis=1)
        v_raw = values(
            v_ptr, colseen_ptr, b, h, in_use, page, within, m, d, l_max,
            s_vp, s_vh, s_vs, has_draft, BLOCK_D, ALIGNED,
        )  # fmt: skip
        if F32:
            e = rounded(e, p_mbits, p_emin, p_max_bits, p_over_bits)
            acc += weighted32(e, widen(v_raw, KIND, F32), OPAQUE)
        else:
            acc += product(e, opaque(widen(v_raw, KIND, F32), OPAQUE, F32), F32)
    at = (item * h_kv + h) * M_PAD + r
    tl.store(l_part_ptr + at, total)
    tl.store(acc_part_ptr + at[:, None] * BLOCK_D + dims[None, :], acc)


@triton.jit
def rescaled(s, seen, mx, total):
    """One step of the online softmax: each row's new running maximum over its seen scores
    ``s``, the factor ``alpha = exp(m_old - m_new)`` its sums so far are rescaled by (0 while
    nothing was seen: a row that has seen nothing sums against 0), the step's terms
    ``exp(s - m_new)`` (0 where unseen) and the rescaled sum of the terms."""
    s = tl.where(seen, s, float("-inf"))
    grown = tl.maximum(mx, tl.max(s, axis=1))
    base = tl.where(grown == float("-inf"), 0.0, grown)
    alpha = tl.exp(mx - base)
    e = tl.exp(s - base[:, None])
    return grown, alpha, e, total * alpha + tl.sum(e, axis=1)


@triton.jit(**_runtime(*_STEP_ARGS, "l_part_ptr", "acc_part_ptr"))
def online(
    q_ptr, k_ptr, v_ptr, table_ptr, t_ptr, l_ptr, row0_ptr, draft_ptr, colseen_ptr,
    sink_ptr, item_first_ptr, item_count_ptr, m_part_ptr, item_b_ptr, key0_ptr,
    l_part_ptr, acc_part_ptr,
    h_q, h_kv, group, d, page_size, l_max, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs,
    s_tb, s_tc, window_ptr, has_draft, has_sink, bmm1_bits, n_mb,
    KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, KEYS: tl.constexpr, OPAQUE: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """Steps 1 and 2 in one pass, float64 only (the same programs): each row's largest
    visible score over the item's keys, and the item's ``sum exp(s - m)`` and ``sum exp(s -
    m) * v`` taken against that running maximum ``m``, rescaled by ``exp(m_old - m_new)``
    each time it grows (a row that has seen nothing yet sums against 0; its sums are 0).
    :func:`combine` with ``RESCALE`` brings the items to the request's maximum. Each key
    and score is read and computed once, where :func:`maxima` and :func:`sums` do both
    twice; the terms pass through one or two more roundings (the rescales)."""
    item, h, r = program_rows(n_mb, BLOCK_M)
    b, start, key_end, rows_ok, _head, lq, first_new, pos, q, window_reach = item_setup(
        q_ptr, t_ptr, l_ptr, row0_ptr, item_b_ptr, key0_ptr, window_ptr, item, h, r,
        group, h_q, d, BLOCK_D, KEYS,
    )  # fmt: skip
    bmm1_scale = bmm1_bits.to(tl.int64).to(tl.float64, bitcast=True)
    dims = tl.arange(0, BLOCK_D)
    mx = tl.full([BLOCK_M], float("-inf"), tl.float64)
    total = tl.zeros([BLOCK_M], tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float64)
    for n0 in range(start, key_end, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        s, seen, in_use, page, within, m = scores(
            q, k_ptr, table_ptr, b, h, keys, key_end, pos, rows_ok, lq, first_new,
            d, page_size, s_kp, s_kh, s_ks, s_tb, s_tc, window_reach, has_draft,
            draft_ptr, l_max, bmm1_scale, KIND, BLOCK_D, OPAQUE, False, ALIGNED,
        )  # fmt: skip
        grown, alpha, e, total = rescaled(s, seen, mx, total)
        v_raw = values(
            v_ptr, colseen_ptr, b, h, in_use, page, within, m, d, l_max,
            s_vp, s_vh, s_vs, has_draft, BLOCK_D, ALIGNED,
        )  # fmt: skip
        acc = acc * alpha[:, None] + product(
            e, opaque(widen(v_raw, KIND, False), OPAQUE, False), False
        )
        mx = grown
    at = (item * h_kv + h) * (n_mb * BLOCK_M) + r
    tl.store(m_part_ptr + at, mx)
    tl.store(l_part_ptr + at, total)
    tl.store(acc_part_ptr + at[:, None] * BLOCK_D + dims[None, :], acc)


@triton.jit
def lane_keys(
    lane, n_lanes, n0, lane_item_ptr, item_b_ptr, key0_ptr, t_ptr, table_ptr, h_kv,
    page_size, s_tb, s_tc, KEYS: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Lane ``lane``'s block of keys ``n0`` on from its item's first: its request, its KV
    head, which keys are read (none for a lane past ``n_lanes``), their pages and slots."""
    ok = lane < n_lanes
    item = tl.load(lane_item_ptr + lane // h_kv, mask=ok, other=0)
    b = tl.load(item_b_ptr + item)
    start = tl.load(key0_ptr + item)
    key_end = tl.where(ok, tl.minimum(start + KEYS, tl.load(t_ptr + b)), 0)
    keys = start + n0 + tl.arange(0, BLOCK_N)
    in_use, page, within = key_places(keys, key_end, table_ptr, b, page_size, s_tb, s_tc)
    return b, lane % h_kv, keys, in_use, page, within


@triton.jit(**_runtime(*_STEP_ARGS, "l_part_ptr", "acc_part_ptr", "lane_item_ptr", "n_lanes"))
def online_lanes(
    q_ptr, k_ptr, v_ptr, table_ptr, t_ptr, l_ptr, row0_ptr, draft_ptr, colseen_ptr,
    sink_ptr, item_first_ptr, item_count_ptr, m_part_ptr, item_b_ptr, key0_ptr,
    l_part_ptr, acc_part_ptr, lane_item_ptr,
    h_q, h_kv, group, d, page_size, l_max, s_kp, s_kh, s_ks, s_vp, s_vh, s_vs,
    s_tb, s_tc, window_ptr, has_draft, has_sink, bmm1_bits, n_mb, n_lanes,
    KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, KEYS: tl.constexpr, OPAQUE: tl.constexpr, ALIGNED: tl.constexpr,
    LANES: tl.constexpr,
):  # fmt: skip
    """:func:`online` for ``LANES`` (item, KV head) pairs a program, where a KV head has at
    most ``BLOCK_M // LANES`` rows (``L_max * group``): each *lane* is one of them, its rows
    ``lane * rows .. + rows`` of the program's (``rows = BLOCK_M // LANES``). Lane ``j`` of
    program ``p`` is the launch's lane ``p * LANES + j``: the item ``lane_item[lane //
    h_kv]``, the KV head ``lane % h_kv`` (``n_lanes``: items x KV heads).

    Each lane's scores are a product of all the program's query rows with its own keys, of
    which its rows are kept; likewise its product with V. A row's products are those
    :func:`online` computes for it (the same shapes, its own query and keys), and everything
    else is per row, so each row's sums are the same bits as there (but a zero's sign:
    a lane's steps past its keys add +0). What is shared is the
    work per row and key, the masks, the exponentials and the rescales, which :func:`online`
    does for ``BLOCK_M`` rows of which a KV head of few rows uses few (one query head a KV
    head and ``L`` of 2: 2 of 16). The steps run to the program's longest lane; a lane past
    its keys adds nothing (its terms are 0, its rescale 1)."""
    rows = BLOCK_M // LANES
    r = tl.arange(0, BLOCK_M)
    lane = r // rows
    first_lane = tl.program_id(0) * LANES
    valid = first_lane + lane < n_lanes
    item = tl.load(lane_item_ptr + (first_lane + lane) // h_kv, mask=valid, other=0)
    h = (first_lane + lane) % h_kv
    b = tl.load(item_b_ptr + item)
    start = tl.load(key0_ptr + item)
    rows_ok, _head, q_base, lq, first_new, pos = rows_of(
        r - lane * rows, b, t_ptr, l_ptr, row0_ptr, h, group, h_q, d
    )
    rows_ok = rows_ok & valid
    key_end = tl.where(valid, tl.minimum(start + KEYS, tl.load(t_ptr + b)), start)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + q_base[:, None] + dims[None, :],
        mask=rows_ok[:, None] & (dims[None, :] < d),
        other=0.0,
    )
    window_reach = tl.load(window_ptr)
    bmm1_scale = bmm1_bits.to(tl.int64).to(tl.float64, bitcast=True)
    mx = tl.full([BLOCK_M], float("-inf"), tl.float64)
    total = tl.zeros([BLOCK_M], tl.float64)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float64)
    longest = tl.max(key_end - start, axis=0)
    for n0 in range(0, longest, BLOCK_N):
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float64)
        for j in tl.static_range(LANES):
            _b, h_j, _keys, in_use, page, within = lane_keys(
                first_lane + j, n_lanes, n0, lane_item_ptr, item_b_ptr, key0_ptr, t_ptr,
                table_ptr, h_kv, page_size, s_tb, s_tc, KEYS, BLOCK_N,
            )  # fmt: skip
            s_j = head_scores(
                q, k_ptr, page, within, in_use, h_j, d, s_kp, s_kh, s_ks, KIND, BLOCK_D,
                OPAQUE, False, ALIGNED,
            )  # fmt: skip
            if j == 0:
                s = s_j
            else:
                s = tl.where((lane == j)[:, None], s_j, s)
        s = s * bmm1_scale
        keys = start[:, None] + n0 + tl.arange(0, BLOCK_N)[None, :]  # each row's
        seen = visible(
            keys, keys < key_end[:, None], keys - first_new[:, None], pos, rows_ok, lq,
            window_reach, has_draft, draft_ptr + (b * l_max * l_max)[:, None], l_max,
        )  # fmt: skip
        grown, alpha, e, total = rescaled(s, seen, mx, total)
        pv = tl.zeros([BLOCK_M, BLOCK_D], tl.float64)
        for j in tl.static_range(LANES):
            b_j, h_j, keys_j, in_use, page, within = lane_keys(
                first_lane + j, n_lanes, n0, lane_item_ptr, item_b_ptr, key0_ptr, t_ptr,
                table_ptr, h_kv, page_size, s_tb, s_tc, KEYS, BLOCK_N,
            )  # fmt: skip
            first_j = tl.load(t_ptr + b_j) - tl.load(l_ptr + b_j)
            v_raw = values(
                v_ptr, colseen_ptr, b_j, h_j, in_use, page, within, keys_j - first_j, d,
                l_max, s_vp, s_vh, s_vs, has_draft, BLOCK_D, ALIGNED,
            )  # fmt: skip
            pv_j = product(e, opaque(widen(v_raw, KIND, False), OPAQUE, False), False)
            if j == 0:
                pv = pv_j
            else:
                pv = tl.where((lane == j)[:, None], pv_j, pv)
        acc = acc * alpha[:, None] + pv
        mx = grown
    at = (item * h_kv + h) * (n_mb * BLOCK_M) + r - lane * rows
    tl.store(m_part_ptr + at, mx, mask=valid)
    tl.store(l_part_ptr + at, total, mask=valid)
    tl.store(acc_part_ptr + at[:, None] * BLOCK_D + dims[None, :], acc, mask=valid[:, None])


_COMBINE_ARGS = (
    "l_part_ptr", "acc_part_ptr", "out_ptr", "bmm2_bits", "t_ptr", "l_ptr", "row0_ptr",
    "sink_ptr", "item_first_ptr", "item_count_ptr", "m_part_ptr", "h_q", "h_kv", "group", "d",
    "has_sink", "n_mb",
)  # fmt: skip


@triton.jit(**_runtime(*_COMBINE_ARGS))
def combine(
    l_part_ptr, acc_part_ptr, out_ptr, bmm2_bits, t_ptr, l_ptr, row0_ptr, sink_ptr,
    item_first_ptr, item_count_ptr, m_part_ptr, h_q, h_kv, group, d, has_sink, n_mb,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, F32: tl.constexpr, RESCALE: tl.constexpr,
):  # fmt: skip
    """Step 3, one program per (request, KV head, block of rows): the items' sums added up
    in item order, the sink's term, and ``bmm2_scale * (sum e * v) / denominator`` stored
    in the request's rows (``F32``: subnormal outputs flushed). ``RESCALE``: the items'
    sums are :func:`online`'s, each against its own maximum ``m_j``, and are brought to the
    row's by ``exp(m_j - m)`` (0 for an item the row saw nothing of)."""
    b = tl.program_id(0)
    h = tl.program_id(1) // n_mb
    r = (tl.program_id(1) % n_mb) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok, head, base, _, _, _ = rows_of(r, b, t_ptr, l_ptr, row0_ptr, h, group, h_q, d)
    M_PAD = n_mb * BLOCK_M
    mx = row_max(
        m_part_ptr, item_first_ptr, item_count_ptr, sink_ptr, b, h, r, rows_ok, head,
        h_kv, has_sink, M_PAD, F32,
    )  # fmt: skip
    dims = tl.arange(0, BLOCK_D)
    first = tl.load(item_first_ptr + b)
    count = tl.load(item_count_ptr + b)
    total = computed(tl.zeros([BLOCK_M], tl.float64), F32)
    acc = computed(tl.zeros([BLOCK_M, BLOCK_D], tl.float64), F32)
    for j in range(count):
        at = ((first + j) * h_kv + h) * M_PAD + r
        # a padding row's parts are not read (the lanes of the one pass do not write them)
        part_l = tl.load(l_part_ptr + at, mask=rows_ok, other=0.0)
        part_acc = tl.load(
            acc_part_ptr + at[:, None] * BLOCK_D + dims[None, :], mask=rows_ok[:, None], other=0.0
        )
        if RESCALE:
            part_m = tl.load(m_part_ptr + at, mask=rows_ok, other=float("-inf"))
            factor = tl.exp(part_m - mx)
            part_l = part_l * factor
            part_acc = part_acc * factor[:, None]
        total += part_l
        acc += part_acc
    if has_sink:
        sink = tl.load(sink_ptr + head, mask=rows_ok, other=float("-inf"))
        total += tl.exp(sink - mx)
    total = tl.where(total > 0, total, 1.0)
    o = computed(bmm2_bits.to(tl.int64).to(tl.float64, bitcast=True), F32) * (acc / total[:, None])
    if F32:
        o = flushed(o)
    tl.store(
        out_ptr + base[:, None] + dims[None, :], o, mask=rows_ok[:, None] & (dims[None, :] < d)
    )
