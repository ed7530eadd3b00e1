"""Shrinking the numbers: the simplest value family at scale 1, default scales (``sm_scale``
from ``head_dim``, q/k/v/o scales 1) and a small seed. Runtime values only."""

from __future__ import annotations

import dataclasses
from typing import Any

from difftest.case import Case, ValueSpec
from difftest.shrink.driver import Probe
from difftest.shrink.passes import attempt, first_accepted

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
