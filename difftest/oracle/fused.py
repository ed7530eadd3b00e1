"""The float64 oracle of :mod:`difftest.oracle.batched`, and its noise floors' float32
roundings, on a CUDA device in three Triton kernels.

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

With :data:`ONE_PASS` (the default since a GPU measured it), steps 1 and 2 are one
kernel for the float64 oracle: an item's sums are taken against its running maximum and
rescaled by ``exp(m_old - m_new)`` as it grows, and step 3 brings each item's sums to the
row's maximum by ``exp(m_item - m)``; each key is read and each score computed once instead
of twice, and the terms pass through a rescale or two more (float64 rounding).

The work is cut into *items*: a request's keys in runs of :data:`KEYS_PER_ITEM`, so a launch
of one long request still spreads over the device. Steps 1 and 2 run one program per item,
KV head and block of query rows; step 3 adds an item's partial sums up, in item order (the
result does not depend on the run). A program's rows are at least :data:`BLOCK_M`; where a
KV head has few (one query head a KV head and ``L`` of 2: 2 of 16), the one pass puts
several (item, KV head) pairs in one program's rows instead, each pair a *lane* with its own
keys (:func:`lanes`, :func:`~difftest.oracle.fused_kernels.online_lanes`): the masks, the
exponentials and the rescales, done for 16 rows a step either way, then serve up to 8 pairs
instead of one, and each row's output is the same as in a program of its own, bit for bit
(a zero's sign aside: a lane's steps past its keys add +0). Values no
row of the request sees are read as 0, as the torch form zeroes them (``0 * NaN`` of a stale
slot would leak into the sum); scores of keys a row does not see are replaced, never used.

The float64 result equals the torch form's within float64 rounding (the sums are taken in
another order). That is checked, not assumed: the first call in a process computes a built-in
sample both ways (every stored dtype, a window, sinks, a draft tree, ragged rows, a long
request cut in items); on a difference larger than float64 rounding it warns once and
every later call takes the torch form. ``tests/unit/test_oracle_fused.py`` runs the kernels
under Triton's interpreter on the CPU against the definition;
``tests/gpu/test_oracle_fused_gpu.py`` on CUDA.

**The noise floors.** A launch with a path over its allowance measures the floors: the
float32 roundings of :class:`~difftest.oracle.batched.Rounding` (the queries as the path rounds
them, float32 arithmetic, the terms ``exp(s - m)`` rounded to the path's probability dtype
before ``P @ V``, divided by their unrounded sum). The torch form gathers and upcasts the
launch's whole cache again for them, hundreds of operations a launch (docs/validation.md,
Run 32: the oracle's phase took eleven times the kernels' time, and a profiled worker ran
the torch form, which then served only the floors, in 1,951 chunks over 659 launches). The
same three kernels compute them
with ``F32`` set (float32 tiles and IEEE float32 products, the probabilities rounded by
integer arithmetic on their bits, bit for bit as torch converts them; see
:mod:`fused_kernels`). Two float32 computations that add in other orders do not give the same
bits, so these are not the torch form's bits: they are a float32 computation of the same
definition, as a correct kernel's is, and their own first-use check
(:func:`floors_checked`) holds them to the torch form by :func:`floors_distance` on the
sample; a disagreement sets the float32 roundings aside alone. A request's floors do not
depend on the launch around it (one program reads one request's keys, and its items are
added in order), which the torch form did not promise on a GPU: a case judged in a packed
launch and replayed alone is held to the same floor. They are off unless
``DIFFTEST_FUSED_FLOORS=1`` (:data:`FLOORS_ENABLED`: they compile and agree on the H200
since Run 35, and are not yet measured against the torch form in a campaign).

Triton compiles each variant once per machine (its disk cache keeps it): one per cache dtype,
head-dim block and compute dtype (the probability dtype is a runtime argument), three kernels
each, about 90 in all, each a second or less. No argument
that changes from launch to launch is specialised on (see :mod:`fused_kernels`): while the
pointers' alignment was, a GPU campaign compiled the kernels anew for most launches and ran
slower than with the torch form (Run 25).

Without Triton or off CUDA, :func:`usable` is ``False`` and the oracle takes the torch form.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from difftest.oracle.batched import (
    HostLens,
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

FLOORS_ENABLED = os.environ.get("DIFFTEST_FUSED_FLOORS", "0") == "1"
"""``True`` only with ``DIFFTEST_FUSED_FLOORS=1``: the noise floors' float32 roundings run in
the kernels (checked at first use). On the H100 (Run 33) and the H200 (Run 34) with Triton 3.6
the float32 ``sums`` kernel failed to compile (its product with V, a ``tl.dot``, had the
terms' whole computation rebuilt in its operand layout, and lowering that failed an
assertion), so they were turned off. Its product is now float32 multiplies and a sum
(:func:`~difftest.oracle.fused_kernels.weighted32`): every variant compiles for sm90 (a CPU
test compiles them), and on the H200 (Run 35) they pass their first-use check and the GPU
tests, and the 2,003 stored verdicts are judged the same with them on as off. They stay off
by default until a warm campaign with them on and off, on the same machine, says which is
faster: their variants' first compiles (Triton's disk cache keeps them) against the torch
form's hundreds of operations a launch whose verdict is over its allowance. The float64
oracle is fused either way."""

ONE_PASS = os.environ.get("DIFFTEST_FUSED_ONE_PASS", "1") != "0"
"""``False`` only with ``DIFFTEST_FUSED_ONE_PASS=0`` (to compare the two forms from outside):
the float64 oracle's steps 1 and 2 in one kernel (:func:`~difftest.oracle.fused_kernels.online`:
each item's sums against its running maximum, rescaled as it grows;
:func:`~difftest.oracle.fused_kernels.combine` brings the items to the row's maximum), which
reads each key and computes each score once where the two passes do both twice (the
``maxima`` kernel was a third of the oracle's device time on the H200, Run 25). The same
definition, summed in another order: equal within float64 rounding, checked at first use like
the two passes. The noise floors' float32 roundings keep two passes: a probability is rounded
against the row's true maximum. The default since docs/validation.md Run 39 (an H100,
flashinfer 0.7.4): on a default campaign's first six launches of 8 the float64 output took
60.8 ms in one pass against 69.8 ms in two (with :data:`KEYS_PER_ITEM` at 2,048: 54.9 against
71.0), within 6.3e-15 of the two passes' output as a share of its largest magnitude; its GPU
tests pass, and the 2,003 stored verdicts are judged alike either way."""

LANES_ENABLED = os.environ.get("DIFFTEST_FUSED_LANES", "1") != "0"
"""``False`` only with ``DIFFTEST_FUSED_LANES=0`` (to compare from outside): where a KV head
has at most ``BLOCK_M // 2`` rows (``L_max * group``), the one pass runs
:func:`~difftest.oracle.fused_kernels.online_lanes`, several (item, KV head) pairs a program
(:func:`lanes`), instead of :func:`~difftest.oracle.fused_kernels.online`, one a program of
whose 16 rows most are padding. The same values either way (each row's products and sums are
the same computation; ``tests/unit/test_oracle_fused.py`` holds them equal), which the first
use in a process checks on its sample (:func:`checked`): a difference, or a variant that
does not build, sets the lanes aside alone."""

_checked: bool | None = None
"""``None``: not checked in this process yet; then whether the two forms agreed."""

_floors_checked: bool | None = None
"""The same for the float32 roundings (:func:`floors_checked`)."""

_lanes_checked: bool | None = None
"""The same for the one pass's lanes (:func:`checked`): whether they gave the values of
one pair a program on the check sample."""

KEYS_PER_ITEM = 2048
"""Keys of one request one program reads (a longer request is several items). 2,048 since
docs/validation.md Run 39: in one pass the oracle's float64 output took 54.9 ms against 60.8
at 512 on a default campaign's first six launches of 8 (an H100; at 512 fewer keys a program
and more items to combine), the stored verdicts judged alike on the GPU."""

BLOCK_M = 16
"""Query rows of a program: ``(row, head in the group)`` pairs of one KV head (rows past a
head's ``L_max * group`` are padding; 16 is the least a float64 ``tl.dot`` takes)."""

AGREEMENT = 1e-12
"""The self-check's allowance, relative to the sample's largest output: float64 rounding of
sums over at most a few thousand terms, with a wide margin (a real mistake is far larger)."""

FLOOR_AGREEMENT = 0.05
"""The float32 self-check's allowance: the fused rounding's distance from the torch form's
(root mean square over the sample's rows), as a share of the distance either has from the
float64 oracle, which is what a noise floor measures. Two float32 computations that sum in
other orders differ by a few float32 ulps; one that rounds its probabilities wrongly, or
not at all, or multiplies in TF32, is as far from the torch form as the floor itself."""

FLOOR_SLACK = 1e-5
"""The float32 self-check's allowance for a rounding whose floor is float32 rounding alone
(probabilities not rounded), relative to the sample's root mean square output."""

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
uint8) widened exactly by placing the bits in a wider float (and for fp8 one exact multiply
by a power of two; :func:`~difftest.oracle.fused_kernels.widen`), independent of Triton's 8-
and 16-bit float support, and the same under its interpreter."""

_BITS = {1: torch.int16, 2: torch.uint8}


@dataclass(frozen=True, slots=True)
class ProbabilityFormat:
    """How a float32 rounding rounds its probabilities, as the kernels take it: mantissa
    bits (0: not rounded), least normal exponent and largest finite value."""

    mbits: int
    emin: int
    largest: float


P_FORMATS: dict[torch.dtype | None, ProbabilityFormat] = {
    None: ProbabilityFormat(0, 0, 0.0),
    torch.bfloat16: ProbabilityFormat(7, -126, float(torch.finfo(torch.bfloat16).max)),
    torch.float16: ProbabilityFormat(10, -14, float(torch.finfo(torch.float16).max)),
    torch.float8_e4m3fn: ProbabilityFormat(3, -6, float(torch.finfo(torch.float8_e4m3fn).max)),
}
"""The probability dtypes the float32 kernels round to (those of
:data:`difftest.judgement.tolerance._P_DTYPES`); a rounding to another takes the torch form."""


@functools.cache
def overflow(p_dtype: torch.dtype | None, device_type: str) -> float | None:
    """What torch's conversion to ``p_dtype`` on this kind of device makes of a value past
    the format's largest and of inf: inf, NaN, or the largest (fp8 e4m3fn has no inf; torch
    2.13's CPU conversion saturates where older ones give NaN), probed once. ``None`` where
    the two differ, or are none of those: the kernels then leave the rounding to the torch
    form."""
    if p_dtype is None:
        return 0.0
    largest = P_FORMATS[p_dtype].largest
    probe = torch.tensor([2 * largest, float("inf")], dtype=torch.float32, device=device_type)
    past, inf = probe.to(p_dtype).to(torch.float64).tolist()
    same = past == inf or (math.isnan(past) and math.isnan(inf))
    if not same or not (math.isnan(past) or math.isinf(past) or past == largest):
        return None
    return float(past)


_kernels: dict[str, Any] | None = None


def usable(device: torch.device) -> bool:
    """Whether the oracle may run fused on ``device`` (CUDA, Triton, not set aside)."""
    return ENABLED and device.type == "cuda" and _checked is not False and _have_triton()


def floors_usable(device: torch.device) -> bool:
    """Whether the noise floors' float32 roundings may run fused on ``device``."""
    return (
        ENABLED
        and FLOORS_ENABLED
        and device.type == "cuda"
        and _floors_checked is not False
        and _have_triton()
    )


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


def is_exact(r: Rounding) -> bool:
    """Whether ``r`` is the float64 oracle itself (float64, probabilities not rounded)."""
    return r.compute_dtype == torch.float64 and r.p_dtype is None


def is_floor(r: Rounding) -> bool:
    """Whether ``r`` is a noise floor's rounding the kernels compute (float32, probabilities
    rounded to a dtype of :data:`P_FORMATS` whose :func:`overflow` is known, or not at
    all)."""
    return (
        r.compute_dtype == torch.float32
        and r.p_dtype in P_FORMATS
        and overflow(r.p_dtype, r.q.device.type) is not None
    )


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
    host_lens: HostLens | None = None,
    use_fused: bool | None = None,
    use_lanes: bool = True,
) -> list[torch.Tensor]:
    """:func:`~difftest.oracle.batched.batched_paged_attention` (same arguments, same
    outputs), its float64 rounding without probability rounding and its float32 roundings
    (the noise floors') computed by the kernels here. ``use_fused``: ``None`` (the default)
    each kind where it is usable and checked (:func:`usable`, :func:`checked`;
    :func:`floors_usable`, :func:`floors_checked`); ``True`` always (a test running them
    under Triton's interpreter); ``False`` never. ``use_lanes``: ``False`` takes one (item,
    KV head) pair a program of the one pass whatever :func:`lanes` says. Any other rounding
    takes the torch form.
    Every fused rounding of a launch shares one plan (its items and index lists, one copy),
    and roundings that read the same queries share their maxima."""
    kwargs: dict[str, Any] = dict(
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        window_left=window_left,
        sinks=sinks,
        draft_mask=draft_mask,
        host_lens=host_lens,
    )
    fast = _fused_roundings(roundings, k_pages, use_fused)
    args = (k_pages, v_pages, block_tables, seq_lens, q_lens)
    if not fast:
        return batched_paged_attention(*args, roundings, **kwargs)
    shape = launch_shape(*args, roundings, window_left, host_lens)
    rest = [r for i, r in enumerate(roundings) if i not in fast]
    slow = iter(batched_paged_attention(*args, rest, **kwargs) if rest else [])
    launch = plan(
        k_pages,
        v_pages,
        block_tables,
        roundings[0].q.shape,
        t_host=shape.t_host,
        l_host=shape.l_host,
        first_host=shape.first_host,
        bmm1_scale=bmm1_scale,
        bmm2_scale=bmm2_scale,
        window_left=window_left,
        sinks=sinks,
        draft_mask=draft_mask,
        use_lanes=use_lanes,
    )
    maxima: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    return [
        paged_attention(launch, r, maxima) if i in fast else next(slow)
        for i, r in enumerate(roundings)
    ]


def _fused_roundings(
    roundings: Sequence[Rounding], k_pages: torch.Tensor, use_fused: bool | None
) -> list[int]:
    """Which roundings the kernels compute: the float64 one without probability rounding
    and the float32 ones of :func:`is_floor`, each kind where it may run."""
    if use_fused is False or not roundings or not takes(k_pages):
        return []
    dev = roundings[0].q.device
    exact = floors = use_fused is True
    if use_fused is None:
        exact = usable(dev) and any(map(is_exact, roundings)) and checked(dev)
        floors = floors_usable(dev) and any(map(is_floor, roundings)) and floors_checked(dev)
    return [
        i for i, r in enumerate(roundings) if (exact and is_exact(r)) or (floors and is_floor(r))
    ]


@dataclass(frozen=True, slots=True)
class Launch:
    """What every rounding of a launch reads, made once: the requests' and items' index
    lists on the device (one copy), the cache as the kernels read it, the masks, and the
    launch's sizes and the kernels' common arguments."""

    num_rows: int
    bs: int
    n_items: int
    h_q: int
    h_kv: int
    d: int
    blocks: Blocks
    n_mb: int
    item_b: torch.Tensor
    key0: torch.Tensor
    lanes: int
    """(item, KV head) pairs a program of the one pass (:func:`lanes`; 1: :func:`~difftest.
    oracle.fused_kernels.online`)."""
    lane_item: torch.Tensor
    """The items in the order the lanes take them, longest first (lane ``i``: the item
    ``lane_item[i // h_kv]``, KV head ``i % h_kv``)."""
    sinks: torch.Tensor | None
    step_args: dict[str, Any]
    """The arguments steps 1 and 2 share, but the queries, the sinks, the maxima and the
    compute dtype's."""
    row_args: dict[str, Any]
    """The arguments all three steps share (the requests' rows), as ``step_args``."""
    bmm2_bits: int

    @property
    def padded_rows(self) -> int:
        """Rows a KV head in the per-item buffers: :attr:`n_mb` blocks of :data:`BLOCK_M`."""
        return self.n_mb * BLOCK_M


def plan(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,
    q_shape: Sequence[int],
    *,
    t_host: Sequence[int],
    l_host: Sequence[int],
    first_host: Sequence[int],
    bmm1_scale: float,
    bmm2_scale: float,
    window_left: int,
    sinks: torch.Tensor | None,
    draft_mask: torch.Tensor | None,
    use_lanes: bool = True,
) -> Launch:
    """The :class:`Launch` of a checked launch: the caller passes the host's view of its
    shapes (``t_host`` ``T_b``, ``l_host`` ``L_b`` with rows packed request after request,
    ``first_host`` each request's first key any row sees); ``draft_mask`` as
    :func:`~difftest.oracle.batched.batched_paged_attention` takes it (``None``: a chain,
    whose visibility is the causal one); ``use_lanes``: whether the one pass may take
    several pairs a program (:func:`lanes`)."""
    dev = k_pages.device
    num_rows, h_q, d = q_shape
    _, h_kv, page_size, _ = k_pages.shape
    bs = len(t_host)
    l_max = max(l_host, default=0)
    # the items, and what each request and item needs, in one host-to-device copy
    req_cols: list[list[int]] = [[], [], [], [], []]  # T_b, L_b, row start, first item, items
    item_req: list[int] = []
    item_key0: list[int] = []
    item_keys: list[int] = []
    row = 0
    for b, (t, n, first) in enumerate(zip(t_host, l_host, first_host, strict=True)):
        count = -(-(t - first) // KEYS_PER_ITEM) if n > 0 else 0
        for col, value in zip(req_cols, (t, n, row, len(item_req), count), strict=True):
            col.append(value)
        item_req += [b] * count
        starts = range(first, first + count * KEYS_PER_ITEM, KEYS_PER_ITEM)
        item_key0 += starts
        item_keys += (min(KEYS_PER_ITEM, t - k) for k in starts)
        row += n
    n_items = len(item_req)
    group = h_q // h_kv
    per_program = lanes(l_max * group, n_items * h_kv) if use_lanes else 1
    # the lanes' items, longest first: a program's lanes then run about as many steps
    order = sorted(range(n_items), key=item_keys.__getitem__, reverse=True)
    reach = window_left if window_left >= 0 else NO_WINDOW
    flat = [v for col in req_cols for v in col] + item_req + item_key0 + order + [reach]
    packed = host_ints(flat, dev)
    t_b, l_b, row_start, item_first, item_count = packed[: 5 * bs].view(5, bs)
    window = packed[-1:]  # in memory: an int argument would compile a variant per size

    kind = _KINDS[k_pages.dtype]
    # the kernels read a row's dims one after another (a pool's layouts all store them so)
    k_pages, v_pages = (p if p.stride(3) == 1 else p.contiguous() for p in (k_pages, v_pages))
    k_src, v_src = cache_source(k_pages), cache_source(v_pages)
    table = block_tables.to(dev)
    if draft_mask is not None and bs:
        mask = draft_rows(draft_mask, bs, l_max, dev)
        seen_cols = _columns_seen(mask, l_b, l_max, window_left)
        draft_u8 = mask.contiguous().view(torch.uint8)
        seen_u8 = seen_cols.contiguous().view(torch.uint8)
    else:
        draft_u8 = seen_u8 = torch.ones(1, dtype=torch.uint8, device=dev)
    blocks = block_sizes(d)
    n_mb = -(-(l_max * group) // BLOCK_M)
    rows = dict(
        t_ptr=t_b,
        l_ptr=l_b,
        row0_ptr=row_start,
        item_first_ptr=item_first,
        item_count_ptr=item_count,
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
    steps = dict(
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
        s_vp=v_pages.stride(0),
        s_vh=v_pages.stride(1),
        s_vs=v_pages.stride(2),
        s_tb=table.stride(0),
        s_tc=table.stride(1),
        window_ptr=window,
        has_draft=int(draft_mask is not None),
        bmm1_bits=float_bits(float(bmm1_scale)),
        KIND=kind,
        ALIGNED=aligned(k_src, v_src, d),
        BLOCK_N=blocks.n,
        KEYS=KEYS_PER_ITEM,
        OPAQUE=dev.type == "cuda",
        **rows,
    )
    return Launch(
        num_rows=num_rows,
        bs=bs,
        n_items=n_items,
        h_q=h_q,
        h_kv=h_kv,
        d=d,
        blocks=blocks,
        n_mb=n_mb,
        item_b=packed[5 * bs : 5 * bs + n_items],
        key0=packed[5 * bs + n_items : 5 * bs + 2 * n_items],
        lanes=per_program,
        lane_item=packed[5 * bs + 2 * n_items : 5 * bs + 3 * n_items],
        sinks=sinks,
        step_args=steps,
        row_args=rows,
        bmm2_bits=float_bits(float(bmm2_scale)),
    )


def paged_attention(
    launch: Launch,
    rounding: Rounding,
    maxima: dict[tuple[int, torch.dtype], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One rounding's ``[R, H_q, D]`` output over ``launch``, as
    :func:`difftest.oracle.batched.batched_paged_attention` defines it: the float64 oracle
    (:func:`is_exact`) or a noise floor's float32 rounding (:func:`is_floor`). ``maxima``:
    each row's maxima per item computed so far, by the queries' identity and the compute
    dtype (roundings that read the same queries share them, as the torch form shares its
    scores)."""
    if not (is_exact(rounding) or is_floor(rounding)):
        raise ValueError(
            f"the kernels do not compute {rounding.compute_dtype}, p {rounding.p_dtype}"
        )
    kernels = _build()
    cd = rounding.compute_dtype
    f32 = int(cd == torch.float32)
    dev = rounding.q.device
    out = torch.empty(launch.num_rows, launch.h_q, launch.d, dtype=cd, device=dev)
    if launch.bs == 0 or launch.num_rows == 0:
        return out
    if launch.n_items == 0:
        return out.zero_()
    q = rounding.q.to(cd).contiguous()
    sink = (
        launch.sinks.to(device=dev, dtype=cd).reshape(-1).contiguous()
        if launch.sinks is not None
        else q.new_zeros(1)
    )
    m_pad = launch.padded_rows
    grid = (launch.n_items, launch.h_kv * launch.n_mb)
    step = dict(
        launch.step_args,
        q_ptr=q,
        sink_ptr=sink,
        item_b_ptr=launch.item_b,
        key0_ptr=launch.key0,
        F32=f32,
    )
    if f32:
        step.update(BLOCK_N=launch.blocks.n32, num_warps=launch.blocks.warps32)
    else:
        if launch.blocks.stages is not None:
            step.update(num_stages=launch.blocks.stages)
        if launch.blocks.regs is not None:
            step.update(maxnreg=launch.blocks.regs)
    one_pass = ONE_PASS and not f32
    acc_part = torch.empty(
        launch.n_items, launch.h_kv, m_pad, launch.blocks.d, dtype=cd, device=dev
    )
    if one_pass:
        m_part = torch.empty(launch.n_items, launch.h_kv, m_pad, dtype=cd, device=dev)
        l_part = torch.empty_like(m_part)
        del step["F32"]
        parts = dict(m_part_ptr=m_part, l_part_ptr=l_part, acc_part_ptr=acc_part)
        if launch.lanes > 1:
            n_lanes = launch.n_items * launch.h_kv
            kernels["online_lanes"][(-(-n_lanes // launch.lanes),)](
                lane_item_ptr=launch.lane_item,
                n_lanes=n_lanes,
                LANES=launch.lanes,
                **parts,
                **step,
            )
        else:
            kernels["online"][grid](**parts, **step)
    else:
        m_part = _maxima(kernels, launch, step, grid, (id(rounding.q), cd), maxima)
        fmt = P_FORMATS[rounding.p_dtype]
        l_part = torch.empty_like(m_part)
        kernels["sums"][grid](
            m_part_ptr=m_part,
            l_part_ptr=l_part,
            acc_part_ptr=acc_part,
            p_mbits=fmt.mbits,
            p_emin=fmt.emin,
            p_max_bits=float_bits(fmt.largest),
            p_over_bits=float_bits(overflow(rounding.p_dtype, dev.type) or 0.0),
            **step,
        )
    kernels["combine"][(launch.bs, launch.h_kv * launch.n_mb)](
        l_part_ptr=l_part,
        acc_part_ptr=acc_part,
        m_part_ptr=m_part,
        sink_ptr=sink,
        out_ptr=out,
        bmm2_bits=launch.bmm2_bits,
        F32=f32,
        RESCALE=int(one_pass),
        **launch.row_args,
    )
    return out


def _maxima(
    kernels: dict[str, Any],
    launch: Launch,
    step: dict[str, Any],
    grid: tuple[int, int],
    key: tuple[int, torch.dtype],
    maxima: dict[tuple[int, torch.dtype], torch.Tensor] | None,
) -> torch.Tensor:
    """Step 1 of the two passes: each row's maximum per item, computed once for roundings
    that read the same queries in the same compute dtype (``key``)."""
    m_part = None if maxima is None else maxima.get(key)
    if m_part is None:
        m_part = torch.empty(
            launch.n_items,
            launch.h_kv,
            launch.padded_rows,
            dtype=key[1],
            device=launch.item_b.device,
        )
        kernels["maxima"][grid](m_part_ptr=m_part, **step)
        if maxima is not None:
            maxima[key] = m_part
    return m_part


@dataclass(frozen=True, slots=True)
class Blocks:
    """A launch's block sizes (powers of two): ``d`` the head dim padded, ``n`` the keys of a
    float64 step (at least 16: what a float64 ``tl.dot`` takes), ``warps`` a program's warps;
    ``n32`` and ``warps32`` the same for the float32 roundings, whose product with V holds a
    step's ``[rows, keys, dims]`` products at once
    (:func:`difftest.oracle.fused_kernels.weighted32`); ``stages`` the float64 steps' software
    pipeline depth and ``regs`` their registers a thread at most (Triton's ``maxnreg``; more
    programs fit on a multiprocessor, what does not fit is spilled), each ``None`` for
    Triton's default (``benchmarks/sweep_device_kernels.py`` varies them)."""

    d: int
    n: int
    warps: int
    n32: int
    warps32: int
    stages: int | None = None
    regs: int | None = None


def cache_source(pages: torch.Tensor) -> torch.Tensor:
    """``pages`` as the kernels read it: natively, or as integers of its width (bf16, fp8)."""
    kind = _KINDS[pages.dtype]
    return pages.view(_BITS[kind]) if kind in _BITS else pages


def aligned(k_src: torch.Tensor, v_src: torch.Tensor, d: int) -> bool:
    """Whether the kernels may read the cache 16 bytes at a time (their ``ALIGNED``): both
    halves start 16-byte aligned, every row starts a multiple of 16 elements from there (the
    page, head and slot strides are multiples of 16) and the head dim is a multiple of 16. A
    campaign's pools always are (the generators' head dims are multiples of 16); one that is
    not is read an element at a time, the same values."""
    strides = (*k_src.stride()[:3], *v_src.stride()[:3])
    return (
        d % 16 == 0
        and all(t.data_ptr() % 16 == 0 for t in (k_src, v_src))
        and all(s % 16 == 0 for s in strides)
    )


def block_sizes(d: int) -> Blocks:
    """Block sizes for head dim ``d``: a float64 step reads 32 keys (16 at head dim 256,
    whose steps are not software-pipelined), and a program holds :data:`BLOCK_M` rows; a
    float32 step's products ``[BLOCK_M, keys, dims]``, 16,384 (64 a thread of 8 warps). Both
    divide :data:`KEYS_PER_ITEM`.

    Until docs/validation.md Run 42 a float64 step's ``[keys, dims]`` tile held 4,096 values
    (256 keys at head dim 16). Compiled for sm90 (Triton 3.6) those spilled 4.5-5.0 KB a
    thread at head dim 16, 360-1,112 bytes at 32, 40-256 at 64 and 1,224 at 256; these
    spill nothing there (head dim 128 had 32 keys already, and its 80 bytes). On an H100, on
    the first launch of 8 of each of 12 oracle shapes of a default campaign, the one pass
    took 106.2 ms against 112.8 (head dim 16: 2.7 against 5.7; 32: 8.2 against 9.7); two
    small launches took 0.15 and 0.04 ms longer (one run each)."""
    dp = max(16, 1 << (d - 1).bit_length())
    return Blocks(
        d=dp,
        n=max(16, min(32, 4096 // dp)),
        warps=4 if dp <= 128 else 8,
        n32=max(4, 16384 // (BLOCK_M * dp)),
        warps32=8,
        stages=1 if dp >= 256 else None,
    )


MAX_LANES = 8
"""The most lanes a program of :func:`~difftest.oracle.fused_kernels.online_lanes` takes
(each is a product with its own keys a step, unrolled: the loop's machine code grows with
them)."""


def lanes(rows: int, n_lanes: int) -> int:
    """Lanes a program of the one pass for a launch whose KV heads have ``rows`` rows each
    (``L_max * group``) and ``n_lanes`` (item, KV head) pairs: the most, a power of two up
    to :data:`MAX_LANES`, whose rows fit :data:`BLOCK_M` and that the pairs fill; 1 (one
    pair a program, :func:`~difftest.oracle.fused_kernels.online`) when no two fit, or
    :data:`LANES_ENABLED` is off, or their first-use check failed."""
    if not LANES_ENABLED or _lanes_checked is False or rows <= 0:
        return 1
    most = max(1, min(MAX_LANES, BLOCK_M // rows, n_lanes))
    return 1 << (most.bit_length() - 1)


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
            "online": fused_kernels.online,
            "online_lanes": fused_kernels.online_lanes,
            "combine": fused_kernels.combine,
        }
    return _kernels


def checked(device: torch.device) -> bool:
    """Whether the fused float64 oracle agrees with the torch form
    (:func:`~difftest.oracle.batched.batched_paged_attention`) on this process's built-in
    sample; computed on the first call, then remembered. A difference, or the kernels failing
    to build, warns once and sets the fused form aside. Where it agrees and the lanes are on
    (:data:`LANES_ENABLED`), the one pass with them is held to it bit for bit on the same
    sample (:func:`_lanes_agree`): a difference or a failure sets the lanes aside alone."""
    global _checked, _lanes_checked
    if _checked is None:
        _checked = _first_use("the fused oracle disagrees", _agrees, device)
        if _checked and LANES_ENABLED and _lanes_checked is None:
            _lanes_checked = _first_use("the fused oracle's lanes disagree", _lanes_agree, device)
    return _checked


def floors_checked(device: torch.device) -> bool:
    """:func:`checked` for the noise floors' float32 roundings (:func:`_floors_agree`): set
    aside on their own, so the float64 oracle stays fused when only they disagree."""
    global _floors_checked
    if _floors_checked is None:
        _floors_checked = _first_use("the fused noise floors disagree", _floors_agree, device)
    return _floors_checked


def _first_use(disagree: str, check: Any, device: torch.device) -> bool:
    """``check(device)``, a warning when it fails (``disagree``: what the warning says) or
    raises (a Triton or driver that cannot build the kernels)."""
    what = disagree.rsplit(" ", 1)[0]
    try:
        agreed = bool(check(device))
    except Exception as exc:
        log.warning("%s unavailable (%s: %s)", what, type(exc).__name__, exc)
        return False
    if not agreed:
        log.warning("%s with the torch form on the check sample: using the torch form", disagree)
    return agreed


@dataclass(frozen=True, slots=True)
class _SampleLaunch:
    """One launch of the built-in check sample: the launch's arguments and its queries."""

    k_pages: torch.Tensor
    v_pages: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    q_lens: list[int]
    q: torch.Tensor
    kwargs: dict[str, Any]

    def torch_form(self, roundings: Sequence[Rounding]) -> list[torch.Tensor]:
        return self._run(batched_paged_attention, roundings)

    def fused(self, roundings: Sequence[Rounding], use_lanes: bool = True) -> list[torch.Tensor]:
        attention = functools.partial(batched_attention, use_fused=True, use_lanes=use_lanes)
        return self._run(attention, roundings)

    def _run(self, attention: Any, roundings: Sequence[Rounding]) -> list[torch.Tensor]:
        args = (self.k_pages, self.v_pages, self.block_tables, self.seq_lens, self.q_lens)
        return attention(*args, roundings, **self.kwargs)  # type: ignore[no-any-return]


def _sample(device: torch.device) -> list[_SampleLaunch]:
    """The check sample: every stored dtype the kernels read, a window, sinks, a draft tree,
    ragged rows and a long request cut in two items, in four launches; KV heads of 12 rows
    (one pair a program) and of 8, 4 and 2 (2, 4 and 8 lanes a program: :func:`lanes`)."""
    gen = torch.Generator().manual_seed(20261204)
    launches = []
    for dtype, d, window, with_sink, tree, group, lens in (
        (torch.bfloat16, 64, -1, False, False, 1, [3, 1, 4, 2]),
        (torch.float16, 80, 700, True, True, 3, [3, 1, 4, 2]),
        (torch.float8_e4m3fn, 128, -1, True, False, 1, [2, 1, 2, 2]),
        (torch.float32, 16, 3, False, True, 2, [3, 1, 4, 2]),
    ):
        h_kv, page_size = 2, 16
        seq = [KEYS_PER_ITEM + 276, 1, 37, 600]  # the first: two items, combined
        width = -(-max(seq) // page_size)
        pages = 4 * width + 40
        k = torch.randn(pages, h_kv, page_size, d, generator=gen).to(dtype)
        v = torch.randn(pages, h_kv, page_size, d, generator=gen).to(dtype)
        table = torch.randperm(pages, generator=gen)[: 4 * width].view(4, width).to(torch.int32)
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
        launches.append(_SampleLaunch(k_d, v_d, table_d, seq_d, lens, q.to(device), kwargs))
    return launches


def _agrees(device: torch.device) -> bool:
    """Whether the fused float64 oracle (one pair a program) equals the torch form's on
    :func:`_sample` within :data:`AGREEMENT` of the largest output."""
    for launch in _sample(device):
        roundings = [Rounding(launch.q)]
        want = launch.torch_form(roundings)[0]
        got = launch.fused(roundings, use_lanes=False)[0]
        scale = float(want.abs().max())
        if not bool(((got - want).abs() <= AGREEMENT * scale).all()):
            return False
    return True


def _lanes_agree(device: torch.device) -> bool:
    """Whether the one pass gives the same values with its lanes as with one pair a program on
    :func:`_sample` (whose launches take 1, 2, 4 and 8 lanes). With the two passes
    (:data:`ONE_PASS` off) there are no lanes: both runs are the same computation."""
    for launch in _sample(device):
        roundings = [Rounding(launch.q)]
        got = launch.fused(roundings)[0]
        want = launch.fused(roundings, use_lanes=False)[0]
        if not _same_values(got, want):
            return False
    return True


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold equal values, NaN where NaN (a zero's sign aside)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.masked_fill(nan, 0), b.masked_fill(nan, 0))


def floor_roundings(q: torch.Tensor) -> list[Rounding]:
    """The float32 roundings the check computes for queries ``q``: probabilities not
    rounded, and rounded to each dtype of :data:`P_FORMATS` (with fp8 queries for fp8, as a
    path of fp8 precision rounds them)."""
    out = []
    for p_dtype in P_FORMATS:
        low = q.to(torch.float8_e4m3fn) if p_dtype == torch.float8_e4m3fn else q.to(torch.bfloat16)
        out.append(Rounding(low, torch.float32, p_dtype))
    return out


def floors_distance(
    got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor
) -> tuple[float, float]:
    """How far a fused float32 rounding ``got`` is from the torch form's ``want``, and the
    allowance :func:`_floors_agree` gives it: :data:`FLOOR_AGREEMENT` of the root mean square
    distance ``want`` has from the float64 oracle ``ref`` (the floor), plus
    :data:`FLOOR_SLACK` of the root mean square output (infinite where NaN differ)."""

    def rms(x: torch.Tensor) -> float:
        return float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0

    if not torch.equal(got.isnan(), want.isnan()):
        return float("inf"), 0.0
    g, w, r = (x.double().nan_to_num() for x in (got, want, ref))
    return rms(g - w), FLOOR_AGREEMENT * rms(w - r) + FLOOR_SLACK * rms(w)


def _floors_agree(device: torch.device) -> bool:
    """Whether the fused float32 roundings (:func:`floor_roundings`) are as near the torch
    form's on :func:`_sample` as :func:`floors_distance` allows."""
    for launch in _sample(device):
        roundings = [Rounding(launch.q), *floor_roundings(launch.q)]
        ref, *want = launch.torch_form(roundings)
        got = launch.fused(roundings[1:])
        for g, w in zip(got, want, strict=True):
            distance, allowed = floors_distance(g, w, ref)
            if not distance <= allowed:
                return False
    return True
