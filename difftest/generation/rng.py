"""A counter-based random number generator that gives the same bits on every device.

``torch.Generator`` streams differ between CPU and CUDA, so a case built on a GPU would not
match the same case built on a laptop. Here every value is a pure function of
``(seed, stream, coordinates)``: a splitmix64 hash in wrapping int64 arithmetic, which torch
computes identically on any device. Normal-looking values come from an Irwin-Hall sum of four
16-bit uniforms, converted exactly to float64 and scaled by correctly rounded operations, so
the float bits match too. Because values are keyed by logical coordinates (request, token,
head, dim) rather than by tensor layout, dropping a request or shortening a prefix leaves the
other values unchanged, which keeps shrinking stable.

Every stream the project draws from is named in :class:`Stream`; its numbers are part of what
a case means (changing one changes the bits of every stored case).
"""

from __future__ import annotations

import enum

import torch


class Stream(enum.IntEnum):
    """Every random stream of the project and its number (the numbers are part of the bits)."""

    Q = 1
    K = 2
    V = 3
    SINKS = 4
    STALE_K = 5
    STALE_V = 6
    PAD = 7
    """Query rows of data-parallel padding."""
    BASE = 8
    """The per-(head, dim) base of the ``near_ties`` keys."""
    OUTLIER = 9
    """Which tokens of ``outlier_tokens`` are outliers."""
    PAGE_ORDER = 10
    """The ``shuffled`` page permutation."""
    STALE_PAGES = 11
    """The ``stale_pages`` table fill."""
    CASE_SEED = 12
    """A campaign's per-chunk case seeds."""


_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_MASK = {s: (1 << (64 - s)) - 1 for s in (30, 27, 31, 11, 48)}


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & _MASK[s]


def mix(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser, on int64 tensors with wrapping arithmetic."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def keyed(seed: int, stream: Stream, device: torch.device | str) -> torch.Tensor:
    """The root key of one stream (a 0-d int64 tensor)."""
    base = torch.tensor(seed & ((1 << 63) - 1), dtype=torch.int64, device=device)
    return mix(mix(base) + stream)


def hash_coords(key: torch.Tensor, *coords: torch.Tensor) -> torch.Tensor:
    """Fold broadcastable int64 coordinate tensors into one hash per element."""
    h = key
    for c in coords:
        h = mix(h + c.to(torch.int64))
    return h


def uniform(h: torch.Tensor) -> torch.Tensor:
    """Uniform float64 in ``[0, 1)`` from 53 bits of the hash."""
    return _shr(h, 11).to(torch.float64) * 2.0**-53


def std_normal(h: torch.Tensor) -> torch.Tensor:
    """Approximately standard normal float64 (Irwin-Hall of four 16-bit uniforms), in ±3.47."""
    total = (h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + _shr(h, 48)
    # Each 16-bit uniform has variance 65536**2 / 12 (to within 2**-16), so four have
    # standard deviation 65536 / sqrt(3).
    normal: torch.Tensor = (total - 131070).to(torch.float64) * (3.0**0.5 / 65536.0)
    return normal


def arange(n: int, device: torch.device | str) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64, device=device)
