""":func:`difftest.generation.rng.normals` on a CUDA device in one Triton kernel.

In torch, :func:`~difftest.generation.rng.normals` is about twenty elementwise passes over
int64 tensors (the splitmix64 finaliser, then the Irwin-Hall sum of four 16-bit fields), each
a kernel that reads and writes the whole buffer. Here every element is hashed and turned
into a normal in registers and written once, as float64. (On the H200 a default GPU case took
about 28 ms to generate, four times its kernels' time; fusing the hash cut a 200-case run's
generation by about 13 %, so most of that time is the family arithmetic, quantising and the
slot scatter after it: docs/validation.md, Run 13.)

The arithmetic is the same integer arithmetic (wrapping int64 multiply, logical shifts as an
arithmetic shift and a mask, exactly as :mod:`rng` writes them) and the same two float64
operations on an exact integer, so the bits are the same. That is also checked, not assumed:
the first call in a process computes a sample both ways and compares the bits; on any
difference (a Triton or compiler that rounds otherwise) it warns once and every later call
takes the torch form. ``tests/gpu/test_fused_normals.py`` compares the two on many shapes.

Without Triton (the CPU build of torch has none) or off CUDA, :func:`usable` is ``False`` and
:mod:`rng` never calls in here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from difftest.generation import splitmix

triton: Any = None
tl: Any = None
_imported = False


def _have_triton() -> bool:
    """Import Triton on first need (a CPU-only run never pays for it)."""
    global triton, tl, _imported
    if not _imported:
        _imported = True
        try:
            import triton as triton_module
            import triton.language as language
        except ImportError:
            return False
        triton, tl = triton_module, language
    return triton is not None


log = logging.getLogger(__name__)

ENABLED = True
"""Set ``False`` to always use the torch form (the check below does so on a mismatch)."""

_checked: bool | None = None
"""``None``: not checked in this process yet; then whether the fused form gave the same bits."""

_kernel: Callable[..., object] | None = None
BLOCK = 1024


def _build_kernel() -> Callable[..., object]:  # pragma: no cover - needs Triton and CUDA
    @triton.jit  # type: ignore[untyped-decorator]
    def normals_kernel(  # type: ignore[no-untyped-def]
        prefix_ptr,
        out_ptr,
        scale_ptr,
        n,
        total,
        GOLDEN: tl.constexpr,
        M1: tl.constexpr,
        M2: tl.constexpr,
        MASK30: tl.constexpr,
        MASK27: tl.constexpr,
        MASK31: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        inside = offs < total
        row = offs // n
        col = offs - row * n
        x = tl.load(prefix_ptr + row, mask=inside, other=0) + (col + GOLDEN)
        x = (x ^ ((x >> 30) & MASK30)) * M1
        x = (x ^ ((x >> 27) & MASK27)) * M2
        x = x ^ ((x >> 31) & MASK31)
        total_fields = (
            (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + ((x >> 48) & 0xFFFF)
        )
        # the integer subtraction and the conversion are exact, as rng's float64 ones are;
        # the scale is read as float64 (a Python float argument would be float32)
        value = (total_fields - 131070).to(tl.float64) * tl.load(scale_ptr)
        tl.store(out_ptr + offs, value, mask=inside)

    return normals_kernel  # type: ignore[no-any-return]


def fused(prefix: torch.Tensor, n: int) -> torch.Tensor:  # pragma: no cover - needs CUDA
    """``rng.normals(prefix, n)`` by the Triton kernel (no check)."""
    global _kernel
    if _kernel is None:
        _kernel = _build_kernel()
    flat = prefix.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((*prefix.shape, n), dtype=torch.float64, device=prefix.device)
    total = flat.numel() * n
    if total:
        scale = _scale_on(prefix.device)
        grid = (triton.cdiv(total, BLOCK),)
        _kernel[grid](  # type: ignore[index]
            flat,
            out,
            scale,
            n,
            total,
            GOLDEN=splitmix.GOLDEN,
            M1=splitmix.M1,
            M2=splitmix.M2,
            MASK30=splitmix.MASK[30],
            MASK27=splitmix.MASK[27],
            MASK31=splitmix.MASK[31],
            BLOCK=BLOCK,
        )
    return out


_scales: dict[torch.device, torch.Tensor] = {}


def _scale_on(device: torch.device) -> torch.Tensor:  # pragma: no cover - needs CUDA
    """The normal's scale as a float64 tensor on ``device``, copied there once (not a host
    to device copy at every call)."""
    if device not in _scales:
        _scales[device] = torch.tensor([splitmix.NORMAL_SCALE], dtype=torch.float64, device=device)
    return _scales[device]


def usable(prefix: torch.Tensor) -> bool:
    """Whether :func:`normals` may take ``prefix`` (CUDA, Triton, not disabled)."""
    return ENABLED and prefix.is_cuda and _checked is not False and _have_triton()


def normals(
    prefix: torch.Tensor, n: int, reference: Callable[[torch.Tensor, int], torch.Tensor]
) -> torch.Tensor:
    """``reference(prefix, n)``'s bits, fused; the first call checks the two agree (see the
    module docstring) and falls back to ``reference`` for good if they do not."""
    global _checked
    if _checked is None:
        _checked = agrees(prefix.device, reference)
        if not _checked:
            log.warning(
                "the fused Triton normals differ from the torch form on this machine; "
                "generating with torch (the same bits, slower)"
            )
            return reference(prefix, n)
    return fused(prefix, n)


def agrees(device: torch.device, reference: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Whether the fused form gives ``reference``'s bits on a sample: prefixes across the
    int64 range, widths of one, odd and power-of-two length."""
    sample = torch.arange(-1000, 1000, dtype=torch.int64, device=device)
    sample = sample * 0x2545F4914F6CDD1D + 12345  # wraps: spreads over the whole int64 range
    for n in (1, 67, 128):
        try:
            mine = fused(sample.view(40, 50), n)
        except Exception as exc:  # a Triton that cannot compile here
            log.warning("fused normals unavailable (%s: %s)", type(exc).__name__, exc)
            return False
        if not torch.equal(
            mine.view(torch.int64), reference(sample.view(40, 50), n).view(torch.int64)
        ):
            return False
    return True
