"""Shrinking a finding to a minimal case that fails the same way (see :mod:`.driver`)."""

from __future__ import annotations

from difftest.reduction.driver import ShrinkBudget, ShrinkPass, narrow, shrink
from difftest.reduction.passes import default_passes

__all__ = ["ShrinkBudget", "ShrinkPass", "default_passes", "narrow", "shrink"]
