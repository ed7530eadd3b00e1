"""Value families: the numbers that fill q, k, v, sinks and stale pool slots.

Every value is a pure function of ``(seed, role, logical coordinates)`` through
:mod:`difftest.generation.rng`, so a case rebuilds bit for bit on any device, and physical page
layout (order, sharing, storage) never changes what a token holds. Families return float64
*logical* values; the materialiser divides by the case's scales and rounds to the stored dtype.

Families, each aimed at a class of kernel mistakes:

``randn``           N(0, scale): the baseline.
``large_logits``    q and k three times larger: sharp softmax, tests max subtraction.
``near_ties``       keys nearly equal within a head: near-uniform softmax, tests summation.
``outlier_tokens``  about one token in 32 has k and v sixteen times larger: split-KV merges.
``position_coded``  flat attention and values that encode the token position: any mask,
                    window or page-indexing mistake moves the output visibly.
"""

from __future__ import annotations

import torch

from difftest.generation import rng
from difftest.generation.rng import Stream
from difftest.model.case import StaleFill, ValueSpec

FAMILIES = ("randn", "large_logits", "near_ties", "outlier_tokens", "position_coded")
"""In shrink order: the first is the simplest."""

_STREAMS = {
    "q": Stream.Q,
    "k": Stream.K,
    "v": Stream.V,
    "sinks": Stream.SINKS,
    "stale_k": Stream.STALE_K,
    "stale_v": Stream.STALE_V,
    "pad": Stream.PAD,
    "base": Stream.BASE,
}


def _normal(seed: int, role: str, device: torch.device, *coords: torch.Tensor) -> torch.Tensor:
    key = rng.keyed(seed, _STREAMS[role], device)
    return rng.std_normal(rng.hash_coords(key, *coords))


def _grid(n: torch.Tensor, heads: int, dim: int) -> tuple[torch.Tensor, ...]:
    """Broadcastable coordinates ``[N,1,1]``, ``[1,H,1]``, ``[1,1,D]`` for a token list."""
    dev = n.device
    return (
        n.view(-1, 1, 1),
        rng.arange(heads, dev).view(1, -1, 1),
        rng.arange(dim, dev).view(1, 1, -1),
    )


def query_values(
    spec: ValueSpec, seed: int, req: torch.Tensor, row: torch.Tensor, heads: int, dim: int
) -> torch.Tensor:
    """Logical q for query rows ``(req[n], row[n])``: float64 ``[N, heads, dim]``."""
    r, h, d = _grid(req, heads, dim)
    x = _normal(seed, "q", req.device, r, row.view(-1, 1, 1), h, d)
    return x * spec.scale * (3.0 if spec.family == "large_logits" else 1.0)


def token_values(
    spec: ValueSpec,
    seed: int,
    role: str,
    req: torch.Tensor,
    tok: torch.Tensor,
    heads: int,
    dim: int,
) -> torch.Tensor:
    """Logical k or v (``role``) of tokens ``(req[n], tok[n])``: float64 ``[N, heads, dim]``.

    Tokens of a shared prefix pass ``req = -1`` so every request sharing them sees the same
    values.
    """
    dev = req.device
    r, h, d = _grid(req, heads, dim)
    t = tok.view(-1, 1, 1)
    x = _normal(seed, role, dev, r, t, h, d)
    family = spec.family
    if family == "large_logits" and role == "k":
        x = x * 3.0
    elif family == "near_ties" and role == "k":
        x = _normal(seed, "base", dev, h, d) + x / 64.0
    elif family == "outlier_tokens":
        lucky = (
            rng.uniform(rng.hash_coords(rng.keyed(seed, Stream.OUTLIER, dev), r, t)) < 1.0 / 32.0
        )
        x = torch.where(lucky, x * 16.0, x)
    elif family == "position_coded":
        if role == "k":
            x = x / 10.0
        else:
            code = torch.remainder(t * (2 * d + 1) + 3 * h, 17) - 8
            x = code.to(torch.float64) / 8.0
    return x * spec.scale


def sink_values(spec: ValueSpec, seed: int, heads: int, device: torch.device) -> torch.Tensor:
    """One float64 sink per query head, in logit units."""
    x = _normal(seed, "sinks", device, rng.arange(heads, device))
    logit_scale = spec.scale**2 * (9.0 if spec.family == "large_logits" else 1.0)
    return x * 3.0 * max(1.0, logit_scale)


def stale_values(
    fill: StaleFill, seed: int, role: str, slots: int, heads: int, dim: int, device: torch.device
) -> torch.Tensor:
    """What a pool slot holds when no live token does: float64 ``[slots, heads, dim]``."""
    if fill == "zeros":
        return torch.zeros(slots, heads, dim, dtype=torch.float64, device=device)
    s, h, d = _grid(rng.arange(slots, device), heads, dim)
    x = _normal(seed, "stale_" + role, device, s, h, d)
    return x * (256.0 if fill == "large" else 1.0)


def padding_row_values(
    seed: int, rows: int, heads: int, dim: int, device: torch.device
) -> torch.Tensor:
    """q rows that belong to no request (data-parallel padding)."""
    r, h, d = _grid(rng.arange(rows, device), heads, dim)
    return _normal(seed, "pad", device, r, h, d)
