"""A role's values drawn, finished and stored in place, on a CUDA device in one Triton kernel.

The torch form of materialising a role (K, V, stale slots, queries) is a chain of whole-buffer
passes: the normals as float64 (:mod:`fused_normals`), then each step of the role's
:class:`~difftest.generation.values.Recipe` (a multiply or divide each), the quantisation scale,
the clamp, the conversion to the stored dtype and an index write into the pool's slots. On a
GPU each pass reads and writes float64 buffers of the pool's size (a preset's case holds tens of
millions of elements), and each is a launch. Here every element computes its normal, runs the
recipe's steps, quantises, converts and is written straight to its slot: the pool is written
once, in its own dtype, and nothing float64 is stored.

The arithmetic is the torch form's: the same integer hash, then the same float64 operations in
the same order (a multiplication at its neutral value is run here and skipped there, and a
division by 1.0 is skipped by both: ``x * 1.0`` and ``x / 1.0`` are ``x``), then float64 to
float32 to the stored dtype, both rounded to nearest even, as torch's conversion of a float64 to
a 16- or 8-bit float goes through float32. It is
also checked, not assumed: the first call in a process stores a sample both ways, with every
step of a recipe active and into every stored dtype, and compares the bytes; on any difference it
warns once and every later call takes the torch form. ``tests/gpu/test_fused_store.py`` compares
whole materialised cases both ways.

The kernel works on tiles of tokens x dims of one head (:func:`tile`), so that the hash's
prefixes are computed where they vary: the token's and the head's rounds once per token of the
tile, and only the last round per element; a flat index, divided into its coordinates per
element, cost five 64-bit divisions an element and four rounds of the hash (64-bit integer
division and multiplication are many instructions each on a GPU). Only the tile's shape is a
compile-time constant; counts, flags and the recipe's numbers are data (the segment table
below), so that a machine builds a kernel per head dim and stored dtype, not per case.

One launch stores several calls (:class:`Segment`, a role of a case): each segment's numbers
are a row of a small int64 table, each tile belongs to one segment (a tile list, built on the
device, says which, and where in it), and the segments of a launch write into one destination
tensor at their own offsets. Inside :func:`deferred` the calls are collected and launched
together when the block ends, a launch per destination tensor: a packed launch's K, V and
stale slots of every case, then its query rows (``materialize.stores_together``): two kernel
launches where a packed launch of 64 small cases made about 275
(``benchmarks/count_store_kernels.py``).

Without Triton or off CUDA, :func:`usable` is ``False`` and the materialiser takes the torch
form. Under Triton's interpreter (``TRITON_INTERPRET=1``) the kernel runs on a CPU, where
``tests/unit/test_fused_store_interpreted.py`` holds it to the torch form on float32 and float16
pools (the interpreter converts to bfloat16 and fp8 its own way, so those two are checked on a
GPU).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch

from difftest.generation import fused_normals, splitmix
from difftest.generation.values import Recipe
from difftest.machine import host_copy

log = logging.getLogger(__name__)

ENABLED = True
"""Set ``False`` to always use the torch form (the check sets it aside on a mismatch)."""

_checked: bool | None = None
"""``None``: not checked in this process yet; then whether the fused form gave the same bytes."""

BLOCK = 2048
"""Elements of a tile (a program's work): see :func:`tile`."""
WARPS = 2
"""Warps of a program. With :data:`BLOCK` chosen by ``benchmarks/sweep_device_kernels.py`` on
an H100 (docs/validation.md, Run 37): on a campaign's first 48 cases at the default GPU
limits (5.3 G elements), 2,048 elements and 2 warps stored them in 28.3-28.9 ms, the earlier
1,024 and 4 in 45.3-47.3 ms (14 times a ``fill_`` of the same pools), the same bytes; other
shapes ranged to 98 ms, not in order of size (register use, not memory, bounds the kernel)."""

Store = Callable[..., None]
""":func:`store`'s signature: ``(dest, slots, page_size, columns, recipe, heads, dim,
divisor, limit)``."""

_kernel: Callable[..., object] | None = None


def _bits(x: float) -> int:
    """A float64's bit pattern as a signed int64 (how a float64 reaches the kernel exactly:
    a Python float argument would be float32)."""
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def quantiser(divisor: float) -> tuple[float, float]:
    """``(multiplier, divisor)`` of the torch form's division by ``divisor``: a power of two is
    multiplied by its (exact) inverse, anything else divided by (``materialize._divide_``)."""
    if divisor == 1.0:
        return 1.0, 1.0
    if math.frexp(divisor)[0] == 0.5 and 2.0**-1000 < divisor < 2.0**1000:
        return 1.0 / divisor, 1.0
    return 1.0, divisor


ROW = (
    "tokens",
    "column",
    "factor",
    "base",
    "dest",
    "key",
    "times",
    "over",
    "scale",
    "then",
    "qmul",
    "qdiv",
    "limit",
    "two_columns",
    "coded",
    "has_factor",
    "has_base",
    "has_over",
    "has_qdiv",
    "clamp",
)
"""A segment's row of the kernel's int64 table, field by field: its token count; where its
tokens start in the column arrays, its factors in the factor array, its base in the base
array and its destination in ``out`` (elements); its hash key; the recipe's numbers and the
quantiser's, as float64 bit patterns (``times`` .. ``limit``); which steps run (0 or 1). The
kernel reads each field at its index here."""

ARRAY_ARGS = ("c0_ptr", "c1_ptr", "slot_ptr", "factor_ptr", "base_ptr", "table_ptr", "tiles_ptr")
"""The per-token and per-segment arrays: neither their alignment nor anything else is
specialised on (slices of a case's index arrays start anywhere)."""
NOT_SPECIALISED = ARRAY_ARGS
"""Triton compiles a kernel per set of constexprs, per "specialisation" of its other integers
(equal to 1, divisible by 16, or neither) and per pointer's 16-byte alignment: a token count,
a flag or a slice of an index array that varies from call to call would build a kernel per
combination (131 in a default GPU campaign's first 60 launches, Run 30), so everything that
varies from segment to segment is in the table, and the arrays are not specialised. The
destination's pointer and strides, the page size and the head dim stay specialised: they tell
the compiler that a row's stores are contiguous and aligned, and take few values
(``benchmarks/count_store_kernels.py`` counts the kernels a campaign builds). A segment's
offset into the destination is data, so the constexpr ``DEST_ALIGNED`` says when every
offset of a launch is a multiple of 16 elements (whole pages and query rows of 16-multiple
head dims: nearly always), without which the compiler could not prove a row's stores aligned
and would store element by element (seen in the PTX for sm_90 by a review of this kernel)."""


class Segment(NamedTuple):
    """One :func:`store` call: the tokens of ``columns`` stored at ``slots`` of ``dest``."""

    dest: torch.Tensor
    slots: torch.Tensor
    page_size: int
    columns: tuple[torch.Tensor, ...]
    recipe: Recipe
    heads: int
    dim: int
    divisor: float
    limit: float | None


def _build_kernel() -> Callable[..., object]:  # pragma: no cover - needs Triton and CUDA
    triton: Any = fused_normals.triton
    tl: Any = fused_normals.tl

    @triton.jit(  # type: ignore[untyped-decorator]
        do_not_specialize=list(NOT_SPECIALISED), do_not_specialize_on_alignment=list(ARRAY_ARGS)
    )
    def store_kernel(  # type: ignore[no-untyped-def]
        c0_ptr,
        c1_ptr,
        slot_ptr,
        factor_ptr,
        base_ptr,
        table_ptr,
        tiles_ptr,
        out_ptr,
        scale_ptr,
        n,
        page_size,
        s_page,
        s_pos,
        s_head,
        s_dim,
        GOLDEN: tl.constexpr,
        M1: tl.constexpr,
        M2: tl.constexpr,
        MASK30: tl.constexpr,
        MASK27: tl.constexpr,
        MASK31: tl.constexpr,
        U1: tl.constexpr,
        U2: tl.constexpr,
        TB: tl.constexpr,
        NB: tl.constexpr,
        ROW: tl.constexpr,
        DEST_ALIGNED: tl.constexpr,
    ):
        # a tile of TB tokens x NB dims of one head, of one segment (tiles[pid] = its segment
        # and its first token there): each coordinate is an arange of its own axis (no division
        # of a flat index), and each hash prefix is computed once on the axes it depends on
        pid = tl.program_id(0)
        seg = tl.load(tiles_ptr + 2 * pid)
        row = table_ptr + seg * ROW
        tokens = tl.load(row + 0)
        first = tl.load(row + 1)
        key = tl.load(row + 5)
        local = tl.load(tiles_ptr + 2 * pid + 1) + tl.arange(0, TB).to(tl.int64)
        token = first + local  # into the column arrays
        head = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, NB).to(tl.int64)
        t_in = local < tokens
        inside = t_in[:, None] & (d < n)[None, :]
        if tl.load(row + 14) != 0:  # coded
            t = tl.load(c1_ptr + token, mask=t_in, other=0)
            code = (t[:, None] * (2 * d[None, :] + 1) + 3 * head) % 17
            x = (code - 8).to(tl.float64) / 8.0
        else:
            h = key + tl.load(c0_ptr + token, mask=t_in, other=0) + GOLDEN
            h = (h ^ ((h >> 30) & MASK30)) * M1
            h = (h ^ ((h >> 27) & MASK27)) * M2
            h = h ^ ((h >> 31) & MASK31)
            if tl.load(row + 13) != 0:  # two columns
                h = h + tl.load(c1_ptr + token, mask=t_in, other=0) + GOLDEN
                h = (h ^ ((h >> 30) & MASK30)) * M1
                h = (h ^ ((h >> 27) & MASK27)) * M2
                h = h ^ ((h >> 31) & MASK31)
            g = h + head + GOLDEN  # [TB]
            g = (g ^ ((g >> 30) & MASK30)) * M1
            g = (g ^ ((g >> 27) & MASK27)) * M2
            g = g ^ ((g >> 31) & MASK31)
            # the element's round, the kernel's most frequent work, on unsigned bits: a
            # logical shift needs no mask, and the four 16-bit fields are summed as two 32-bit
            # halves (the same integers as the signed form's, so the same value)
            e = (g[:, None] + d[None, :] + GOLDEN).to(tl.uint64, bitcast=True)  # [TB, NB]
            e = (e ^ (e >> 30)) * U1
            e = (e ^ (e >> 27)) * U2
            e = e ^ (e >> 31)
            lo = e.to(tl.uint32)
            hi = (e >> 32).to(tl.uint32)
            fields = (lo & 0xFFFF) + (lo >> 16) + (hi & 0xFFFF) + (hi >> 16)
            x = (fields.to(tl.int32) - 131070).to(tl.float64) * tl.load(scale_ptr)
        if tl.load(row + 15) != 0:  # a factor per token
            f = tl.load(factor_ptr + tl.load(row + 2) + local, mask=t_in, other=1.0)
            x = x * f[:, None]
        x = x * tl.load(row + 6).to(tl.float64, bitcast=True)  # times
        if tl.load(row + 17) != 0:  # a division by 1.0 leaves every value as it is
            x = x / tl.load(row + 7).to(tl.float64, bitcast=True)  # over
        if tl.load(row + 16) != 0:  # a base per head and dim
            b = tl.load(base_ptr + tl.load(row + 3) + head * n + d, mask=d < n, other=0.0)
            x = x + b[None, :]
        x = x * tl.load(row + 8).to(tl.float64, bitcast=True)  # scale
        x = x * tl.load(row + 9).to(tl.float64, bitcast=True)  # then
        x = x * tl.load(row + 10).to(tl.float64, bitcast=True)  # qmul
        if tl.load(row + 18) != 0:
            x = x / tl.load(row + 11).to(tl.float64, bitcast=True)  # qdiv
        if tl.load(row + 19) != 0:  # clamp
            lim = tl.load(row + 12).to(tl.float64, bitcast=True)
            x = tl.minimum(tl.maximum(x, -lim), lim)
        slot = tl.load(slot_ptr + token, mask=t_in, other=0)
        at_token = (slot // page_size) * s_page + (slot % page_size) * s_pos + head * s_head
        dest = tl.load(row + 4)
        if DEST_ALIGNED:  # every segment starts at a multiple of 16 elements: wide stores
            dest = tl.multiple_of(dest, 16)
        where = dest + at_token[:, None] + d[None, :] * s_dim
        value = x.to(tl.float32).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + where, value, mask=inside)

    return store_kernel  # type: ignore[no-any-return]


def tile(dim: int) -> tuple[int, int]:
    """The kernel's tile ``(tokens, dims)`` of one head for rows of ``dim`` values: the dims
    padded to a power of two, as many tokens as fit beside them in :data:`BLOCK` elements (at
    least one). A tile's shape is a compile-time constant, so a machine builds one kernel per
    head dim (and stored dtype) it meets. A tile holds one head: spanning several, as it did
    until Run 30, saved only the token's hash rounds for the other heads (one or two rounds a
    token against one an element) and built a kernel per head count besides."""
    nb = _pow2_at_least(dim)
    return max(1, BLOCK // nb), nb


def _pow2_at_least(x: int) -> int:
    """The smallest power of two at least ``x`` (``x >= 1``)."""
    return 1 << (max(1, x) - 1).bit_length()


def launch_key(segment: Segment) -> tuple[object, ...]:
    """Segments with equal keys may share a launch: one destination tensor's memory, dtype,
    strides and device, one page size, head count and head dim."""
    dest = segment.dest
    return (
        dest.untyped_storage().data_ptr(),
        dest.device,
        dest.dtype,
        dest.stride(),
        segment.page_size,
        segment.heads,
        segment.dim,
    )


def _check(segment: Segment) -> None:
    if not 1 <= len(segment.columns) <= 2:
        raise ValueError(f"{len(segment.columns)} token columns: not the kernel's shape")
    shape = segment.dest.shape
    if segment.dest.dim() != 4 or shape[2:] != (segment.heads, segment.dim):
        raise ValueError(f"destination {tuple(shape)} is not [pages, page_size, heads, dim]")


def launch_arguments(
    segments: Sequence[Segment],
) -> tuple[tuple[int, int], dict[str, Any]] | None:
    """The kernel's grid and arguments, by name, to store ``segments`` (of one
    :func:`launch_key`) in one launch (``None``: no token to store). Each segment's numbers go
    to its row of an int64 table (:data:`ROW`), which reaches the device in one copy with each
    segment's tile count; the tile list is built from those on the device (:func:`_tiles`),
    and the per-token arrays of several segments are concatenated there."""
    if not segments:
        return None
    key = launch_key(segments[0])
    for s in segments:
        _check(s)
        if launch_key(s) != key:
            raise ValueError("segments of different destinations cannot share a launch")
    live = [s for s in segments if s.columns[0].numel() > 0]
    if not live:
        return None
    first = live[0]
    out = min((s.dest for s in live), key=lambda t: t.data_ptr())
    size = out.element_size()
    tb = tile(first.dim)[0]
    table = np.zeros((len(live), len(ROW)), dtype=np.int64)
    tiles_per = np.zeros(len(live), dtype=np.int64)
    column = factor_at = base_at = 0
    factors, bases = [], []
    for i, s in enumerate(live):
        r, tokens = s.recipe, s.columns[0].numel()
        qmul, qdiv = quantiser(s.divisor)
        row = {
            "tokens": tokens,
            "column": column,
            "factor": factor_at,
            "base": base_at,
            "dest": (s.dest.data_ptr() - out.data_ptr()) // size,
            "key": r.key,
            "times": _bits(r.times),
            "over": _bits(r.over),
            "scale": _bits(r.scale),
            "then": _bits(r.then),
            "qmul": _bits(qmul),
            "qdiv": _bits(qdiv),
            "limit": _bits(s.limit if s.limit is not None else 1.0),
            "two_columns": len(s.columns) == 2,
            "coded": r.coded,
            "has_factor": r.factor is not None,
            "has_base": r.base is not None,
            "has_over": r.over != 1.0,
            "has_qdiv": qdiv != 1.0,
            "clamp": s.limit is not None,
        }
        table[i] = [int(row[name]) for name in ROW]
        column += tokens
        if r.factor is not None:
            factors.append(r.factor.reshape(-1))
            factor_at += tokens
        if r.base is not None:
            bases.append(r.base.reshape(-1))
            base_at += s.heads * s.dim
        tiles_per[i] = -(-tokens // tb)
    first_tile = np.cumsum(tiles_per) - tiles_per
    on_device = host_copy.to_device(
        {"table": table, "tiles_per": tiles_per, "first_tile": first_tile}, out.device
    )
    count = int(tiles_per.sum())
    tiles = _tiles(on_device["tiles_per"], on_device["first_tile"], count, tb)
    # the normals' scale, a float64 on the device; also the pointer passed where no array is read
    scale = fused_normals._scale_on(out.device)

    s_page, s_pos, s_head, s_dim = out.stride()
    args: dict[str, Any] = {
        "c0_ptr": _joined([s.columns[0].reshape(-1) for s in live], torch.int64),
        "c1_ptr": _joined([s.columns[-1].reshape(-1) for s in live], torch.int64),
        "slot_ptr": _joined([s.slots.reshape(-1) for s in live], torch.int64),
        "factor_ptr": _joined(factors, torch.float64) if factors else scale,
        "base_ptr": _joined(bases, torch.float64) if bases else scale,
        "table_ptr": on_device["table"],
        "tiles_ptr": tiles,
        "out_ptr": out,
        "scale_ptr": scale,
        "n": first.dim,
        "page_size": first.page_size,
        "s_page": s_page,
        "s_pos": s_pos,
        "s_head": s_head,
        "s_dim": s_dim,
        **constexprs(first.dim, bool((table[:, ROW.index("dest")] % 16 == 0).all())),
    }
    return (count, first.heads), args


def _tiles(per: torch.Tensor, first: torch.Tensor, count: int, tb: int) -> torch.Tensor:
    """int64 ``[count, 2]``: each tile's segment and its first token there, for segments of
    ``per`` tiles each starting at tile ``first``, built on their device (a launch of large
    cases has about a million tiles: built on the host they were a large array to fill and
    copy; here they are four operations, none of which waits for the device)."""
    segment = torch.repeat_interleave(per, output_size=count)
    start = (torch.arange(count, dtype=torch.int64, device=per.device) - first[segment]) * tb
    return torch.stack([segment, start], dim=1)


def constexprs(dim: int, dest_aligned: bool) -> dict[str, object]:
    """The kernel's compile-time constants for rows of ``dim`` values: the hash's, the tile's
    shape (:func:`tile`), the table's row width and whether every segment's destination
    offset is a multiple of 16 elements (``DEST_ALIGNED``)."""
    tb, nb = tile(dim)
    return {
        "GOLDEN": splitmix.GOLDEN,
        "M1": splitmix.M1,
        "M2": splitmix.M2,
        "MASK30": splitmix.MASK[30],
        "MASK27": splitmix.MASK[27],
        "MASK31": splitmix.MASK[31],
        "U1": splitmix.M1 & (1 << 64) - 1,
        "U2": splitmix.M2 & (1 << 64) - 1,
        "TB": tb,
        "NB": nb,
        "ROW": len(ROW),
        "DEST_ALIGNED": dest_aligned,
    }


def _joined(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``parts`` end to end, contiguous, of ``dtype`` (one part: itself, no copy)."""
    whole = parts[0] if len(parts) == 1 else torch.cat(parts)
    return whole.to(dtype).contiguous()


def launch(segments: Sequence[Segment]) -> None:  # pragma: no cover - needs CUDA
    """Store ``segments`` (of one :func:`launch_key`) by one launch of the Triton kernel (no
    check)."""
    global _kernel
    if _kernel is None:
        _kernel = _build_kernel()
    arguments = launch_arguments(segments)
    if arguments is not None:
        grid, args = arguments
        _kernel[grid](**args, num_warps=WARPS)  # type: ignore[index]


def one_by_one(reference: Store, segments: Sequence[Segment]) -> None:
    """``segments`` stored by ``reference`` (the torch form) one after the other: what one
    :func:`launch` writes, where there is no kernel (the tests' and benchmarks' stand-in for
    it on a CPU)."""
    for segment in segments:
        reference(*segment)


def fused(
    dest: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    columns: tuple[torch.Tensor, ...],
    recipe: Recipe,
    heads: int,
    dim: int,
    divisor: float,
    limit: float | None,
) -> None:  # pragma: no cover - needs CUDA
    """:func:`store` by the Triton kernel, at once (no check)."""
    launch([Segment(dest, slots, page_size, columns, recipe, heads, dim, divisor, limit)])


def usable(device: torch.device) -> bool:
    """Whether :func:`store` may run fused on ``device`` (CUDA, Triton, not set aside)."""
    return (
        ENABLED and device.type == "cuda" and _checked is not False and fused_normals.usable(device)
    )


def store(
    dest: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    columns: tuple[torch.Tensor, ...],
    recipe: Recipe,
    heads: int,
    dim: int,
    divisor: float,
    limit: float | None,
    reference: Store,
) -> None:
    """Write ``recipe``'s values of the tokens of ``columns`` (1-d int64 each), divided by
    ``divisor`` and clamped to ``±limit`` (``None``: not clamped), in ``dest``'s dtype, at
    ``dest[slots[i] // page_size, slots[i] % page_size]``; ``dest`` is ``[pages, page_size,
    heads, dim]``, any strides. ``reference`` is the torch form (same arguments): the first
    call checks the two agree and falls back to it for good if they do not."""
    global _checked
    if _checked is None:
        _checked = agrees(dest.device, reference)
        if not _checked:
            log.warning(
                "the fused Triton store differs from the torch form on this machine; "
                "materialising with torch (the same bits, slower)"
            )
    if not _checked or not 1 <= len(columns) <= 2:
        reference(dest, slots, page_size, columns, recipe, heads, dim, divisor, limit)
        return
    segment = Segment(dest, slots, page_size, columns, recipe, heads, dim, divisor, limit)
    waiting: list[Segment] | None = getattr(_deferred, "segments", None)
    if waiting is not None:
        _check(segment)
        waiting.append(segment)
        return
    launch([segment])


_deferred = threading.local()
"""``segments``: the fused stores this thread asked for inside :func:`deferred`, not yet
launched (a thread's own: launches materialised on other threads are not its to launch)."""


@contextmanager
def deferred() -> Iterator[None]:
    """Fused stores asked for inside this block are launched when it ends, those of one
    destination tensor together (:func:`launch_key`: a packed launch's K, V and stale slots,
    every case's, are one launch instead of two to four a case; so are its queries when they
    share a tensor). The segments of one launch must write disjoint elements, as a case's
    roles and a launch's cases do (live and stale slots are disjoint, each case has its own
    part of the launch's pool); the kernel's tiles run in no particular order. A nested block
    is part of the outermost one: its stores launch when the outermost ends, and nothing is
    launched if the outermost raises. Stores that take the torch form (off CUDA, or set
    aside) run at once, as outside the block."""
    if getattr(_deferred, "segments", None) is not None:
        yield
        return
    _deferred.segments = []
    try:
        yield
        segments: list[Segment] = _deferred.segments
    finally:
        _deferred.segments = None
    groups: dict[tuple[object, ...], list[Segment]] = {}
    for segment in segments:
        groups.setdefault(launch_key(segment), []).append(segment)
    for group in groups.values():
        launch(group)


def agrees(device: torch.device, reference: Store) -> bool:
    """Whether the fused form stores ``reference``'s bytes on a sample: every stored dtype, a
    strided destination (a head-major pool seen slot by slot), one and two token columns, each
    step of a recipe active (a token factor, a base, a division by a non-power of two, a
    clamp that bites) and a coded recipe; each call launched alone, and all of them as the
    segments of one launch, each into its own part of one pool."""
    tokens = 300
    heads, dim, page_size = 3, 67, 16
    req = torch.arange(tokens, dtype=torch.int64, device=device) % 5 - 1
    tok = torch.arange(tokens, dtype=torch.int64, device=device) * 7
    # distinct slots out of order (97 is prime to 340; no draw from torch's generators)
    slots = torch.arange(tokens, dtype=torch.int64, device=device) * 97 % (tokens + 40)
    factor = torch.where(tok % 3 == 0, 16.0, 1.0).to(torch.float64)
    base = torch.linspace(-2.0, 2.0, heads * dim, dtype=torch.float64, device=device)
    recipes = (
        Recipe(key=-(1 << 62) + 17, factor=factor, times=3.0, scale=0.7, then=3.0),
        Recipe(key=12345, over=10.0, base=base.view(heads, dim), scale=2.5),
        Recipe(key=7, times=256.0),
        Recipe(key=0, scale=0.3, coded=True),
    )
    cases: list[tuple[tuple[torch.Tensor, ...], Recipe, float, float | None]] = [
        ((req, tok), recipes[0], 0.3, 448.0),
        ((req, tok), recipes[1], 0.25, 6.0),
        ((slots,), recipes[2], 1.0, 448.0),
        ((req, tok), recipes[3], 3.0, None),
        ((tok,), recipes[0], 1.0, None),
    ]
    pages = -(-(tokens + 40) // page_size)
    dtypes = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float32)
    for dtype in dtypes:
        # an fp8 pool is always clamped (its values saturate at 448)
        sample = [c for c in cases if dtype != torch.float8_e4m3fn or c[3] is not None]
        pool = torch.zeros((len(sample) * pages, heads, page_size, dim), dtype=dtype, device=device)
        alone, together, theirs = pool.clone(), pool.clone(), pool.clone()

        def part(whole: torch.Tensor, i: int) -> torch.Tensor:
            return whole[i * pages : (i + 1) * pages].transpose(1, 2)

        try:
            for i, (columns, recipe, divisor, limit) in enumerate(sample):
                args = (slots, page_size, columns, recipe, heads, dim, divisor, limit)
                fused(part(alone, i), *args)
            launch(
                [
                    Segment(part(together, i), slots, page_size, cols, rec, heads, dim, div, lim)
                    for i, (cols, rec, div, lim) in enumerate(sample)
                ]
            )
        except Exception as exc:  # a Triton that cannot compile this here
            log.warning("fused store unavailable (%s: %s)", type(exc).__name__, exc)
            return False
        for i, (columns, recipe, divisor, limit) in enumerate(sample):
            reference(
                part(theirs, i), slots, page_size, columns, recipe, heads, dim, divisor, limit
            )
        if not (
            torch.equal(_raw(alone), _raw(theirs)) and torch.equal(_raw(together), _raw(theirs))
        ):
            return False
    return True


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (fp8 has no ``equal`` kernel everywhere; bytes compare NaN payloads too)."""
    return t.contiguous().view(torch.uint8)
