"""Shrinking a finding to a minimal case that fails the same way (see :mod:`.driver`)."""

from __future__ import annotations

from difftest.reduction.driver import Prober, ShrinkBudget, Shrinker, ShrinkOutcome, shrink
from difftest.reduction.passes import default_passes
from difftest.reduction.probe import ShrinkPass

__all__ = [
    "Prober",
    "ShrinkBudget",
    "ShrinkOutcome",
    "ShrinkPass",
    "Shrinker",
    "default_passes",
    "shrink",
]
