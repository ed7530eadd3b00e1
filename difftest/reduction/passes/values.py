"""Shrinking the numbers: the simplest value family at scale 1, default scales (``sm_scale``
from ``head_dim``, q/k/v/o scales 1) and a small seed. Runtime values only."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from difftest.model.case import Case, ValueSpec
from difftest.reduction.probe import Probe, attempt, first_accepted

_DEFAULT_SCALES: dict[str, float | None] = {
    "sm_scale": None,
    "q_scale": 1.0,
    "k_scale": 1.0,
    "v_scale": 1.0,
    "o_scale": 1.0,
}


def simplest_values(case: Case, probe: Probe) -> Case:
    """``randn`` at scale 1; else the family alone; else the scale alone."""
    v = case.values
    if v == ValueSpec():
        return case
    return first_accepted(
        case,
        probe,
        [
            lambda: case.replace(values=ValueSpec()),
            lambda: case.replace(values=dataclasses.replace(v, family="randn")),
            lambda: case.replace(values=dataclasses.replace(v, scale=1.0)),
        ],
    )


def _with_attention(case: Case, **changes: Any) -> Case:
    return case.replace(attention=dataclasses.replace(case.attention, **changes))


def default_scales(case: Case, probe: Probe) -> Case:
    """Every scale at its default at once; else one scale at a time."""
    a = case.attention
    differing = {k: v for k, v in _DEFAULT_SCALES.items() if getattr(a, k) != v}
    if not differing:
        return case
    case = attempt(case, probe, _with_attention, case, **differing)
    for name, default in differing.items():
        if getattr(case.attention, name) != default:
            case = attempt(case, probe, _with_attention, case, **{name: default})
    return case


def small_seed(case: Case, probe: Probe) -> Case:
    """Seed 0 (every value changes, so this keeps only value-independent failures)."""
    if case.seed == 0:
        return case
    return attempt(case, probe, lambda: case.replace(seed=0))


RESEEDS = (0, 1, 2, 3)
"""Seeds tried by :func:`reseeded_prefixes`."""


def _prefix_and_seed(case: Case, request: int, prefix: int, seed: int) -> Case:
    lens = list(case.batch.prefix_lens)
    lens[request] = prefix
    batch = dataclasses.replace(case.batch, prefix_lens=tuple(lens))
    return case.replace(batch=batch, seed=seed)


def reseeded_prefixes(case: Case, probe: Probe) -> Case:
    """A shorter prefix under another seed, both at once.

    Whether some failures show depends on the values (a race shows only where the two orders
    round differently): a shorter prefix with the current seed may not show it and the current
    prefix with another seed may not either, while the shorter prefix with another seed does.
    Used for such findings only (:func:`difftest.reduction.passes.default_passes`): it costs up
    to 16 runs a request.
    """
    makers = []
    for request, prefix in enumerate(case.batch.prefix_lens):
        for shorter in sorted({0, 1, prefix // 2, prefix - 1}):
            if 0 <= shorter < prefix:
                for seed in RESEEDS:
                    if seed != case.seed:
                        makers.append(
                            functools.partial(_prefix_and_seed, case, request, shorter, seed)
                        )
    return first_accepted(case, probe, makers)
