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
compile-time constant; counts, flags and the recipe's numbers are arguments, so that a
machine builds a kernel per head dim and stored dtype, not per case.

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
from collections.abc import Callable
from typing import Any

import torch

from difftest.generation import fused_normals, splitmix
from difftest.generation.values import Recipe

log = logging.getLogger(__name__)

ENABLED = True
"""Set ``False`` to always use the torch form (the check sets it aside on a mismatch)."""

_checked: bool | None = None
"""``None``: not checked in this process yet; then whether the fused form gave the same bytes."""

BLOCK = 1024

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


FLOAT_ARGS = ("times", "over", "scale", "then", "qmul", "qdiv", "limit")
"""The recipe's numbers (float64 bit patterns): the kernel's arguments, not specialised."""
FLAG_ARGS = ("two_columns", "coded", "has_factor", "has_base", "has_over", "has_qdiv", "clamp")
"""Which steps run (0 or 1): arguments, not specialised."""
COLUMN_ARGS = ("c0_ptr", "c1_ptr", "slot_ptr", "factor_ptr", "base_ptr")
"""The per-token arrays: specialised neither on their alignment nor otherwise."""
NOT_SPECIALISED = ("key", "tokens", *FLOAT_ARGS, *FLAG_ARGS, *COLUMN_ARGS)
"""Triton compiles a kernel per set of constexprs, per "specialisation" of its other integers
(equal to 1, divisible by 16, or neither) and per pointer's 16-byte alignment: a token count,
a flag or a slice of an index array that varies from call to call would build a kernel per
combination (131 in a default GPU campaign's first 60 launches, Run 30), so these are plain
arguments. The destination's pointer and strides, the page size and the head dim stay
specialised: they tell the compiler that a row's stores are contiguous and aligned, and take
few values (``benchmarks/count_store_kernels.py`` counts the kernels a campaign builds)."""


def _build_kernel() -> Callable[..., object]:  # pragma: no cover - needs Triton and CUDA
    triton: Any = fused_normals.triton
    tl: Any = fused_normals.tl

    @triton.jit(  # type: ignore[untyped-decorator]
        do_not_specialize=list(NOT_SPECIALISED), do_not_specialize_on_alignment=list(COLUMN_ARGS)
    )
    def store_kernel(  # type: ignore[no-untyped-def]
        c0_ptr,
        c1_ptr,
        slot_ptr,
        factor_ptr,
        base_ptr,
        out_ptr,
        scale_ptr,
        key,
        tokens,
        n,
        page_size,
        s_page,
        s_pos,
        s_head,
        s_dim,
        times,
        over,
        scale,
        then,
        qmul,
        qdiv,
        limit,
        two_columns,
        coded,
        has_factor,
        has_base,
        has_over,
        has_qdiv,
        clamp,
        GOLDEN: tl.constexpr,
        M1: tl.constexpr,
        M2: tl.constexpr,
        MASK30: tl.constexpr,
        MASK27: tl.constexpr,
        MASK31: tl.constexpr,
        TB: tl.constexpr,
        NB: tl.constexpr,
    ):
        # a tile of TB tokens x NB dims of one head: each coordinate is an arange of its own
        # axis (no division of a flat index), and each hash prefix is computed once on the
        # axes it depends on, then broadcast
        token = tl.program_id(0).to(tl.int64) * TB + tl.arange(0, TB).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, NB).to(tl.int64)
        t_in = token < tokens
        inside = t_in[:, None] & (d < n)[None, :]
        if coded != 0:
            t = tl.load(c1_ptr + token, mask=t_in, other=0)
            code = (t[:, None] * (2 * d[None, :] + 1) + 3 * head) % 17
            x = (code - 8).to(tl.float64) / 8.0
        else:
            h = key.to(tl.int64) + tl.load(c0_ptr + token, mask=t_in, other=0) + GOLDEN
            h = (h ^ ((h >> 30) & MASK30)) * M1
            h = (h ^ ((h >> 27) & MASK27)) * M2
            h = h ^ ((h >> 31) & MASK31)
            if two_columns != 0:
                h = h + tl.load(c1_ptr + token, mask=t_in, other=0) + GOLDEN
                h = (h ^ ((h >> 30) & MASK30)) * M1
                h = (h ^ ((h >> 27) & MASK27)) * M2
                h = h ^ ((h >> 31) & MASK31)
            g = h + head + GOLDEN  # [TB]
            g = (g ^ ((g >> 30) & MASK30)) * M1
            g = (g ^ ((g >> 27) & MASK27)) * M2
            g = g ^ ((g >> 31) & MASK31)
            e = g[:, None] + d[None, :] + GOLDEN  # [TB, NB]
            e = (e ^ ((e >> 30) & MASK30)) * M1
            e = (e ^ ((e >> 27) & MASK27)) * M2
            e = e ^ ((e >> 31) & MASK31)
            fields = (
                (e & 0xFFFF) + ((e >> 16) & 0xFFFF) + ((e >> 32) & 0xFFFF) + ((e >> 48) & 0xFFFF)
            )
            x = (fields - 131070).to(tl.float64) * tl.load(scale_ptr)
        if has_factor != 0:
            f = tl.load(factor_ptr + token, mask=t_in, other=1.0)
            x = x * f[:, None]
        x = x * times.to(tl.int64).to(tl.float64, bitcast=True)
        if has_over != 0:  # a division by 1.0 leaves every value as it is
            x = x / over.to(tl.int64).to(tl.float64, bitcast=True)
        if has_base != 0:
            b = tl.load(base_ptr + head * n + d, mask=d < n, other=0.0)
            x = x + b[None, :]
        x = x * scale.to(tl.int64).to(tl.float64, bitcast=True)
        x = x * then.to(tl.int64).to(tl.float64, bitcast=True)
        x = x * qmul.to(tl.int64).to(tl.float64, bitcast=True)
        if has_qdiv != 0:
            x = x / qdiv.to(tl.int64).to(tl.float64, bitcast=True)
        if clamp != 0:
            lim = limit.to(tl.int64).to(tl.float64, bitcast=True)
            x = tl.minimum(tl.maximum(x, -lim), lim)
        slot = tl.load(slot_ptr + token, mask=t_in, other=0)
        at_token = (slot // page_size) * s_page + (slot % page_size) * s_pos + head * s_head
        where = at_token[:, None] + d[None, :] * s_dim
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


def launch_arguments(
    dest: torch.Tensor,
    slots: torch.Tensor,
    page_size: int,
    columns: tuple[torch.Tensor, ...],
    recipe: Recipe,
    heads: int,
    dim: int,
    divisor: float,
    limit: float | None,
) -> tuple[tuple[int, int], dict[str, Any]] | None:
    """The kernel's grid and arguments, by name, for :func:`store`'s arguments (``None``: no
    token to store)."""
    if not 1 <= len(columns) <= 2:
        raise ValueError(f"{len(columns)} token columns: not the kernel's shape")
    if dest.dim() != 4 or dest.shape[2:] != (heads, dim):
        raise ValueError(f"destination {tuple(dest.shape)} is not [pages, page_size, heads, dim]")
    flat = [c.reshape(-1).to(torch.int64).contiguous() for c in columns]
    tokens = flat[0].numel()
    if tokens == 0:
        return None
    # the normals' scale, a float64 on the device; also the pointer passed where no array is read
    scale = fused_normals._scale_on(dest.device)
    qmul, qdiv = quantiser(divisor)
    tb, nb = tile(dim)
    s_page, s_pos, s_head, s_dim = dest.stride()
    args: dict[str, Any] = {
        "c0_ptr": flat[0],
        "c1_ptr": flat[-1],
        "slot_ptr": slots.reshape(-1).to(torch.int64).contiguous(),
        "factor_ptr": recipe.factor.contiguous() if recipe.factor is not None else scale,
        "base_ptr": recipe.base.contiguous() if recipe.base is not None else scale,
        "out_ptr": dest,
        "scale_ptr": scale,
        "key": recipe.key,
        "tokens": tokens,
        "n": dim,
        "page_size": page_size,
        "s_page": s_page,
        "s_pos": s_pos,
        "s_head": s_head,
        "s_dim": s_dim,
        "times": _bits(recipe.times),
        "over": _bits(recipe.over),
        "scale": _bits(recipe.scale),
        "then": _bits(recipe.then),
        "qmul": _bits(qmul),
        "qdiv": _bits(qdiv),
        "limit": _bits(limit if limit is not None else 1.0),
        "two_columns": int(len(flat) == 2),
        "coded": int(recipe.coded),
        "has_factor": int(recipe.factor is not None),
        "has_base": int(recipe.base is not None),
        "has_over": int(recipe.over != 1.0),
        "has_qdiv": int(qdiv != 1.0),
        "clamp": int(limit is not None),
        "GOLDEN": splitmix.GOLDEN,
        "M1": splitmix.M1,
        "M2": splitmix.M2,
        "MASK30": splitmix.MASK[30],
        "MASK27": splitmix.MASK[27],
        "MASK31": splitmix.MASK[31],
        "TB": tb,
        "NB": nb,
    }
    return (-(-tokens // tb), heads), args


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
    """:func:`store` by the Triton kernel (no check)."""
    global _kernel
    if _kernel is None:
        _kernel = _build_kernel()
    launch = launch_arguments(dest, slots, page_size, columns, recipe, heads, dim, divisor, limit)
    if launch is not None:
        grid, args = launch
        _kernel[grid](**args)  # type: ignore[index]


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
    fused(dest, slots, page_size, columns, recipe, heads, dim, divisor, limit)


def agrees(device: torch.device, reference: Store) -> bool:
    """Whether the fused form stores ``reference``'s bytes on a sample: every stored dtype, a
    strided destination (a head-major pool seen slot by slot), one and two token columns, each
    step of a recipe active (a token factor, a base, a division by a non-power of two, a
    clamp that bites) and a coded recipe."""
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
        for columns, recipe, divisor, limit in cases:
            if dtype == torch.float8_e4m3fn and limit is None:
                continue  # an fp8 pool is always clamped (its values saturate at 448)
            pool = torch.zeros((pages, heads, page_size, dim), dtype=dtype, device=device)
            mine, theirs = pool.clone(), pool.clone()
            try:
                fused(
                    mine.transpose(1, 2),
                    slots,
                    page_size,
                    columns,
                    recipe,
                    heads,
                    dim,
                    divisor,
                    limit,
                )
            except Exception as exc:  # a Triton that cannot compile this here
                log.warning("fused store unavailable (%s: %s)", type(exc).__name__, exc)
                return False
            reference(
                theirs.transpose(1, 2),
                slots,
                page_size,
                columns,
                recipe,
                heads,
                dim,
                divisor,
                limit,
            )
            if not torch.equal(_raw(mine), _raw(theirs)):
                return False
    return True


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (fp8 has no ``equal`` kernel everywhere; bytes compare NaN payloads too)."""
    return t.contiguous().view(torch.uint8)
