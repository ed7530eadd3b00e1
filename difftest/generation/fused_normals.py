""":func:`difftest.generation.rng.token_normals` on a CUDA device in one Triton kernel.

In torch, a family's normals are two steps of many small passes: the hash of each (role,
token, head) prefix, one splitmix64 finaliser (about eight int64 kernels) per coordinate,
then the innermost coordinate's hash and the Irwin-Hall sum of its four 16-bit fields (about
twenty more). On a GPU each pass is a kernel launch that reads and writes a whole buffer,
and the prefixes are small, so the launches, not the arithmetic, are the cost: a preset's
case took about 15 ms to generate, most of it launching the prefix hashes (docs/validation.md,
Run 15). Here every element folds its role's key, its token's coordinates, its head and its
dim in registers, turns the hash into a normal and is written once, as float64.

The arithmetic is the same integer arithmetic (wrapping int64 adds and multiplies, logical
shifts as an arithmetic shift and a mask, exactly as :mod:`rng` writes them) and the same two
float64 operations on an exact integer, so the bits are the same. That is also checked, not
assumed: the first call in a process computes a sample both ways and compares the bits; on
any difference (a Triton or compiler that rounds otherwise) it warns once and every later
call takes the torch form. ``tests/gpu/test_fused_normals.py`` compares the two on many
shapes and on every tensor of the stored cases.

Without Triton (the CPU build of torch has none) or off CUDA, :func:`usable` is ``False`` and
:mod:`rng` never calls in here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
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

Reference = Callable[[Sequence[int], Sequence[torch.Tensor], int, int], torch.Tensor]
"""``rng``'s torch form of :func:`fused`, with the same arguments."""

_kernel: Callable[..., object] | None = None
BLOCK = 1024
MAX_KEYS = 2
MAX_COLUMNS = 2


def _build_kernel() -> Callable[..., object]:  # pragma: no cover - needs Triton and CUDA
    # the keys are never specialised: a key that happens to be 1 or a multiple of 16 would
    # otherwise compile a variant of its own
    @triton.jit(do_not_specialize=["key0", "key1"])  # type: ignore[untyped-decorator]
    def token_normals_kernel(  # type: ignore[no-untyped-def]
        c0_ptr,
        c1_ptr,
        out_ptr,
        scale_ptr,
        key0,
        key1,
        tokens,
        heads,
        n,
        total,
        TWO_KEYS: tl.constexpr,
        TWO_COLUMNS: tl.constexpr,
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
        d = offs % n
        rest = offs // n
        head = rest % heads
        rest = rest // heads
        token = rest % tokens
        x = tl.zeros([BLOCK], dtype=tl.int64) + key0.to(tl.int64)
        if TWO_KEYS:
            x = tl.where(rest // tokens == 0, x, key1.to(tl.int64))
        # one finaliser per coordinate, in rng.hash_coords' order: the token's columns, the
        # head, then the dim (rng.normals)
        x = x + tl.load(c0_ptr + token, mask=inside, other=0) + GOLDEN
        x = (x ^ ((x >> 30) & MASK30)) * M1
        x = (x ^ ((x >> 27) & MASK27)) * M2
        x = x ^ ((x >> 31) & MASK31)
        if TWO_COLUMNS:
            x = x + tl.load(c1_ptr + token, mask=inside, other=0) + GOLDEN
            x = (x ^ ((x >> 30) & MASK30)) * M1
            x = (x ^ ((x >> 27) & MASK27)) * M2
            x = x ^ ((x >> 31) & MASK31)
        x = x + head + GOLDEN
        x = (x ^ ((x >> 30) & MASK30)) * M1
        x = (x ^ ((x >> 27) & MASK27)) * M2
        x = x ^ ((x >> 31) & MASK31)
        x = x + d + GOLDEN
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

    return token_normals_kernel  # type: ignore[no-any-return]


def takes(keys: Sequence[int], columns: Sequence[torch.Tensor]) -> bool:
    """Whether the kernel's shape covers these keys and token columns."""
    return 1 <= len(keys) <= MAX_KEYS and 1 <= len(columns) <= MAX_COLUMNS


def fused(
    keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int
) -> torch.Tensor:  # pragma: no cover - needs CUDA
    """``rng.token_normals(keys, columns, heads, n)`` by the Triton kernel (no check)."""
    global _kernel
    if _kernel is None:
        _kernel = _build_kernel()
    if not takes(keys, columns):
        raise ValueError(f"{len(keys)} keys and {len(columns)} columns: not one kernel's shape")
    flat = [c.reshape(-1).to(torch.int64).contiguous() for c in columns]
    tokens = flat[0].numel()
    dev = flat[0].device
    out = torch.empty((len(keys), tokens, heads, n), dtype=torch.float64, device=dev)
    total = out.numel()
    if total:
        grid = (triton.cdiv(total, BLOCK),)
        _kernel[grid](  # type: ignore[index]
            flat[0],
            flat[-1],
            out,
            _scale_on(dev),
            keys[0],
            keys[-1],
            tokens,
            heads,
            n,
            total,
            TWO_KEYS=len(keys) == 2,
            TWO_COLUMNS=len(flat) == 2,
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


def usable(device: torch.device) -> bool:
    """Whether :func:`token_normals` may run on ``device`` (CUDA, Triton, not disabled)."""
    return ENABLED and device.type == "cuda" and _checked is not False and _have_triton()


def token_normals(
    keys: Sequence[int],
    columns: Sequence[torch.Tensor],
    heads: int,
    n: int,
    reference: Reference,
) -> torch.Tensor:
    """``reference(keys, columns, heads, n)``'s bits, fused; the first call checks the two
    agree (see the module docstring) and falls back to ``reference`` for good if they do not."""
    global _checked
    if _checked is None:
        _checked = agrees(columns[0].device, reference)
        if not _checked:
            log.warning(
                "the fused Triton normals differ from the torch form on this machine; "
                "generating with torch (the same bits, slower)"
            )
    if not _checked or not takes(keys, columns):
        return reference(keys, columns, heads, n)
    return fused(keys, columns, heads, n)


def agrees(device: torch.device, reference: Reference) -> bool:
    """Whether the fused form gives ``reference``'s bits on a sample: keys and coordinates
    across the int64 range (negative ones too: a shared prefix's request is -1), one and two
    keys and columns, widths of one, odd and power-of-two length."""
    spread = torch.arange(-500, 500, dtype=torch.int64, device=device)
    spread = spread * 0x2545F4914F6CDD1D + 12345  # wraps: spreads over the whole int64 range
    small = torch.arange(-1, 999, dtype=torch.int64, device=device)
    samples = (
        ((splitmix.GOLDEN,), (spread,), 3, 1),
        ((-12345, 1 << 40), (small, spread), 5, 67),
        ((7, -(1 << 62)), (spread,), 1, 128),
        ((1,), (small, small), 2, 128),
    )
    for keys, columns, heads, n in samples:
        try:
            mine = fused(keys, columns, heads, n)
        except Exception as exc:  # a Triton that cannot compile here
            log.warning("fused normals unavailable (%s: %s)", type(exc).__name__, exc)
            return False
        theirs = reference(keys, columns, heads, n)
        if mine.shape != theirs.shape or not torch.equal(
            mine.view(torch.int64), theirs.view(torch.int64)
        ):
            return False
    return True
