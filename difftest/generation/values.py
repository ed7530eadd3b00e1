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

The innermost coordinate (dim) is hashed last, by :func:`rng.normals`, and the families'
arithmetic runs in place on its result: the same float64 operations, in the same order, as
``x * a * b`` written out, so the same bits. K and V of the same tokens share one pass
(:func:`kv_values`).
"""

from __future__ import annotations

import torch

from difftest.generation import rng
from difftest.generation.rng import Stream
from difftest.model.case import StaleFill, ValueFamily, ValueSpec

FAMILIES: tuple[ValueFamily, ...] = (
    "randn",
    "large_logits",
    "near_ties",
    "outlier_tokens",
    "position_coded",
)
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


def _normals(
    seed: int, roles: tuple[str, ...], columns: tuple[torch.Tensor, ...], heads: int, dim: int
) -> torch.Tensor:
    """Normals of ``(role, *token, head, d)`` for each role, token (its coordinates in
    ``columns``, 1-d each), head and ``d < dim``: float64 ``[len(roles), N, heads, dim]`` (the
    roles' hashes in one pass)."""
    keys = [rng.key(seed, _STREAMS[r]) for r in roles]
    return rng.token_normals(keys, columns, heads, dim)


def _rows(n: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcastable coordinates ``[N,1]`` and ``[1,H]`` for a token list (dim comes last)."""
    return n.view(-1, 1), rng.arange(heads, n.device).view(1, -1)


def query_values(
    spec: ValueSpec, seed: int, req: torch.Tensor, row: torch.Tensor, heads: int, dim: int
) -> torch.Tensor:
    """Logical q for query rows ``(req[n], row[n])``: float64 ``[N, heads, dim]``."""
    x = _normals(seed, ("q",), (req, row), heads, dim)[0]
    if spec.scale != 1.0:  # x * 1.0 is x
        x.mul_(spec.scale)
    return x.mul_(3.0) if spec.family == "large_logits" else x


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
    return kv_values(spec, seed, req, tok, heads, dim, roles=(role,))[0]


def kv_values(
    spec: ValueSpec,
    seed: int,
    req: torch.Tensor,
    tok: torch.Tensor,
    heads: int,
    dim: int,
    roles: tuple[str, ...] = ("k", "v"),
) -> list[torch.Tensor]:
    """:func:`token_values` of each role (k and v by default), hashed in one pass."""
    dev = req.device
    family = spec.family
    coded = family == "position_coded"
    hashed = tuple(r for r in roles if not (coded and r == "v"))  # coded v needs no hash
    r, h = _rows(req, heads)
    t = tok.view(-1, 1)
    drawn: dict[str, torch.Tensor] = {}
    if hashed:
        drawn = dict(zip(hashed, _normals(seed, hashed, (req, tok), heads, dim), strict=True))
    if family == "outlier_tokens":
        lucky = rng.uniform(rng.hash_coords(rng.keyed(seed, Stream.OUTLIER, dev), r, t)) < 1 / 32
        factor = torch.where(lucky, 16.0, 1.0).to(torch.float64).view(-1, 1, 1)  # x * 1.0 is x
    out = []
    for role in roles:
        if coded and role == "v":
            d = rng.arange(dim, dev)
            code = torch.remainder(t.view(-1, 1, 1) * (2 * d + 1) + 3 * h.view(1, -1, 1), 17)
            out.append(code.sub_(8).to(torch.float64).div_(8.0).mul_(spec.scale))
            continue
        x = drawn[role]
        if family == "large_logits" and role == "k":
            x.mul_(3.0)
        elif family == "near_ties" and role == "k":
            base = _normal(seed, "base", dev, h.view(-1, 1), rng.arange(dim, dev).view(1, -1))
            x.div_(64.0).add_(base)
        elif family == "outlier_tokens":
            x.mul_(factor)
        elif coded:
            x.div_(10.0)
        out.append(x.mul_(spec.scale) if spec.scale != 1.0 else x)  # x * 1.0 is x
    return out


def sink_values(spec: ValueSpec, seed: int, heads: int, device: torch.device) -> torch.Tensor:
    """One float64 sink per query head, in logit units."""
    x = _normal(seed, "sinks", device, rng.arange(heads, device))
    logit_scale = spec.scale**2 * (9.0 if spec.family == "large_logits" else 1.0)
    return x * 3.0 * max(1.0, logit_scale)


def stale_values(
    fill: StaleFill, seed: int, role: str, slots: int, heads: int, dim: int, device: torch.device
) -> torch.Tensor:
    """What a pool slot holds when no live token does: float64 ``[slots, heads, dim]``."""
    return stale_kv_values(fill, seed, rng.arange(slots, device), heads, dim, roles=(role,))[0]


def stale_kv_values(
    fill: StaleFill,
    seed: int,
    slot: torch.Tensor,
    heads: int,
    dim: int,
    roles: tuple[str, ...] = ("k", "v"),
) -> list[torch.Tensor]:
    """:func:`stale_values` of the pool slots ``slot`` only, for each role in one pass."""
    if fill == "zeros":
        shape = (slot.numel(), heads, dim)
        return [torch.zeros(shape, dtype=torch.float64, device=slot.device) for _ in roles]
    drawn = _normals(seed, tuple("stale_" + r for r in roles), (slot,), heads, dim)
    return [x.mul_(256.0) if fill == "large" else x for x in drawn.unbind(0)]


def padding_row_values(
    seed: int, rows: int, heads: int, dim: int, device: torch.device
) -> torch.Tensor:
    """q rows that belong to no request (data-parallel padding)."""
    return _normals(seed, ("pad",), (rng.arange(rows, device),), heads, dim)[0]
