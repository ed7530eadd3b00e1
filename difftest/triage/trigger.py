"""A finding's trigger: the features its shrunk case needs, found by ablation.

For each feature the shrunk case has (:mod:`difftest.triage.features`), the case with just
that feature reset is run through the finding's path: when the finding goes away (another
outcome, or it becomes another group's bug), the feature is in the trigger. A reset the case
model refuses, or the path does not support, proves nothing (it is left out: the smallest
page size XQA supports is not a trigger of XQA's bugs). Most of these candidates were tried by
the shrinker already, and the :class:`~difftest.reduction.Prober` answers them from its cache:
an ablation costs one run for each feature the shrink never touched.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from difftest.model.case import Case
from difftest.reduction.driver import Prober
from difftest.reduction.probe import BudgetExhausted
from difftest.triage.features import FEATURES, describe

ABLATION_RUNS = len(FEATURES)
"""Runs an ablation may take beyond its shrink's budget (one per feature at most)."""
ABLATION_SHARE = 0.5
"""Seconds an ablation may take beyond its shrink's, as a share of the shrink's seconds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trigger:
    """The features a finding needs, as trigger labels in vocabulary order."""

    labels: tuple[str, ...]
    untested: tuple[str, ...] = ()
    """Features the case has whose reset could not be run before the budget ended: kept in
    the trigger (the finding may need them), and said."""

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(sorted({*self.labels, *self.untested}))

    def words(self) -> str:
        text = describe(self.key)
        return text + (f" (not ablated: {', '.join(self.untested)})" if self.untested else "")

    def to_json(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "untested": list(self.untested)}


def ablate(case: Case, prober: Prober) -> Trigger:
    """The trigger of the finding ``prober`` checks, on its shrunk ``case``."""
    # The ablation gets its own allowance past the shrink's: its runs, and half the shrink's
    # seconds (the campaign takes what it spends out of later shrinks' share).
    seconds = prober.budget.max_seconds
    if math.isfinite(seconds):
        seconds = time.monotonic() - prober.start + ABLATION_SHARE * seconds
    prober.budget = dataclasses.replace(
        prober.budget, max_runs=prober.runs + ABLATION_RUNS, max_seconds=seconds
    )
    needed: list[str] = []
    untested: list[str] = []
    for feature in FEATURES:
        label = feature.label(case)
        if label is None:
            continue
        candidate = feature.reset_case(case)
        if candidate is None:
            continue
        try:
            kept = prober.check(candidate)
        except BudgetExhausted:
            untested.append(label)
            continue
        if kept is False:
            needed.append(label)
    return Trigger(labels=tuple(needed), untested=tuple(untested))
