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
(:func:`recipe_values`). The few values that are no tensor of a case's size (outlier factors,
the near-ties base, the sinks) are computed on the host, where its plan is
(:mod:`difftest.generation.placement`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
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
    return query_recipe(spec, seed).apply(_normals(seed, ("q",), (req, row), heads, dim)[0])


def query_recipe(spec: ValueSpec, seed: int) -> Recipe:
    """The :class:`Recipe` of the queries' values."""
    then = 3.0 if spec.family == "large_logits" else 1.0
    return Recipe(rng.key(seed, Stream.Q), scale=spec.scale, then=then)


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """How one role's float64 values come from its normals, for ``N`` tokens: the normal
    (``key``'s, of each token's coordinates, head and dim), times the token's ``factor``, times
    ``times``, divided by ``over``, plus ``base[head, dim]``, times ``scale``, times ``then``, in
    that order. A ``coded`` recipe has no normals: it starts from the position code of
    ``position_coded`` values. :meth:`apply` skips the steps at their neutral value (``x * 1.0``
    and ``x / 1.0`` are ``x``); a fused kernel may run them all and get the same bits."""

    key: int
    factor: torch.Tensor | None = None
    """float64 ``[N]``, or ``None`` (1)."""
    times: float = 1.0
    over: float = 1.0
    base: torch.Tensor | None = None
    """float64 ``[heads, dim]``, or ``None`` (0)."""
    scale: float = 1.0
    then: float = 1.0
    coded: bool = False

    def for_tokens(self, part: slice) -> Recipe:
        """This recipe for the tokens ``part`` of its ``N`` (its factors sliced)."""
        if self.factor is None:
            return self
        return dataclasses.replace(self, factor=self.factor[part])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """The steps after the normal, in place on ``x`` (float64 ``[N, heads, dim]``)."""
        if self.factor is not None:
            x.mul_(self.factor.view(-1, 1, 1))
        if self.times != 1.0:
            x.mul_(self.times)
        if self.over != 1.0:
            x.div_(self.over)
        if self.base is not None:
            x.add_(self.base)
        if self.scale != 1.0:
            x.mul_(self.scale)
        if self.then != 1.0:
            x.mul_(self.then)
        return x


def position_code(tok: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """The start of a ``coded`` recipe: ``((t * (2d + 1) + 3h) mod 17 - 8) / 8`` for each token
    position ``t``, head ``h`` and dim ``d``, float64 ``[N, heads, dim]``."""
    dev = tok.device
    d = rng.arange(dim, dev)
    h = rng.arange(heads, dev).view(1, -1, 1)
    code = torch.remainder(tok.view(-1, 1, 1) * (2 * d + 1) + 3 * h, 17)
    return code.sub_(8).to(torch.float64).div_(8.0)


def outlier_key(seed: int) -> int:
    """``outlier_tokens``' hash key for a case of ``seed``."""
    return rng.key(seed, Stream.OUTLIER)


def outlier_factors(key: int, req: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """``outlier_tokens``: the factor of each token ``(req[n], tok[n])`` (int64 host arrays;
    shared prefix tokens pass ``req = -1``), 16 for about one in 32, else 1: float64 ``[N]``
    (on the host; :func:`outlier_factors_on` on a device). ``key``: :func:`outlier_key`."""
    h = rng.host_hash(key, req, tok)
    return np.where(rng.host_uniform(h) < 1 / OUTLIER_ODDS, OUTLIER_FACTOR, 1.0)


def outlier_factors_on(key: torch.Tensor, req: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """:func:`outlier_factors` of tokens on their device, ``key`` being :func:`outlier_key`
    as a one-element int64 tensor there (no operation waits for the device:
    a large case has about a million tokens, whose hashes cost milliseconds on the host)."""
    h = rng.hash_coords(key, req, tok)
    return torch.where(rng.uniform(h) < 1 / OUTLIER_ODDS, OUTLIER_FACTOR, 1.0).to(torch.float64)


OUTLIER_ODDS = 32
"""``outlier_tokens``: about one token in this many is an outlier."""
OUTLIER_FACTOR = 16.0
"""``outlier_tokens``: an outlier token's factor on its keys and values."""


def near_ties_base(seed: int, heads: int, dim: int) -> np.ndarray:
    """``near_ties``: the per-(KV head, dim) base of the keys, float64 ``[heads, dim]`` (host)."""
    h = np.arange(heads, dtype=np.int64).reshape(-1, 1)
    d = np.arange(dim, dtype=np.int64).reshape(1, -1)
    return rng.host_std_normal(rng.host_hash(rng.key(seed, _STREAMS["base"]), h, d))


def kv_recipes(
    spec: ValueSpec,
    seed: int,
    factor: torch.Tensor | None,
    base: torch.Tensor | None,
    roles: tuple[str, ...] = ("k", "v"),
) -> list[Recipe]:
    """The :class:`Recipe` of each role's values of a case's stored tokens, given their
    ``outlier_tokens`` factors (:func:`outlier_factors`) and the ``near_ties`` base
    (:func:`near_ties_base`) on the tokens' device, each ``None`` for the other families."""
    family = spec.family
    out = []
    for role in roles:
        key = rng.key(seed, _STREAMS[role])
        if family == "position_coded":
            if role == "v":
                out.append(Recipe(key, scale=spec.scale, coded=True))
            else:
                out.append(Recipe(key, over=10.0, scale=spec.scale))
        elif family == "large_logits" and role == "k":
            out.append(Recipe(key, times=3.0, scale=spec.scale))
        elif family == "near_ties" and role == "k":
            out.append(Recipe(key, over=64.0, base=base, scale=spec.scale))
        else:
            out.append(Recipe(key, factor=factor, scale=spec.scale))
    return out


def recipe_values(
    recipes: Sequence[Recipe], columns: tuple[torch.Tensor, ...], heads: int, dim: int
) -> list[torch.Tensor]:
    """Each recipe's float64 ``[N, heads, dim]`` values for the tokens of ``columns`` (the
    normals of all that have them hashed in one pass; a coded recipe's code is of the last
    column, the token position)."""
    keys = [r.key for r in recipes if not r.coded]
    drawn = iter(rng.token_normals(keys, columns, heads, dim).unbind(0) if keys else ())
    out = []
    for r in recipes:
        x = position_code(columns[-1], heads, dim) if r.coded else next(drawn)
        out.append(r.apply(x))
    return out


def sink_values(spec: ValueSpec, seed: int, heads: int) -> np.ndarray:
    """One float64 sink per query head, in logit units (host)."""
    x = rng.host_std_normal(rng.host_hash(rng.key(seed, _STREAMS["sinks"]), np.arange(heads)))
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
    recipes = [stale_recipe(fill, seed, r) for r in roles]
    return recipe_values(recipes, (slot,), heads, dim)


def stale_recipe(fill: StaleFill, seed: int, role: str) -> Recipe:
    """The :class:`Recipe` of a stale pool slot's ``role`` (k or v) values (not for
    ``zeros``, which are no draw)."""
    return Recipe(rng.key(seed, _STREAMS["stale_" + role]), times=256.0 if fill == "large" else 1.0)


def padding_row_values(
    seed: int, rows: int, heads: int, dim: int, device: torch.device
) -> torch.Tensor:
    """q rows that belong to no request (data-parallel padding)."""
    return _normals(seed, ("pad",), (rng.arange(rows, device),), heads, dim)[0]


def padding_recipe(seed: int) -> Recipe:
    """The :class:`Recipe` of data-parallel padding rows (plain normals)."""
    return Recipe(rng.key(seed, Stream.PAD))
