"""The reduction passes and the search helpers they share.

A pass is ``run(case, probe) -> Case``: it proposes smaller candidates, keeps each one the
probe accepts, and returns where it got. Candidates are built through :func:`build`, which
turns an :class:`~difftest.model.errors.InvalidCase` into "no candidate" (rejected without a run).
Numeric fields shrink with :func:`search_down`: straight to the floor, else a binary search
for the smallest failing value, then single steps down (the probe caches what it has already
seen, so steps over known values cost nothing).

The passes themselves are in :mod:`difftest.reduction.passes`, which also fixes their order.
This module holds only what passes and the driver share: the probe's type, a named pass, and
the search helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from difftest.model.case import Case
from difftest.model.errors import InvalidCase


class BudgetExhausted(Exception):
    """Raised by the probe when the budget is spent; ends the shrink where it stands."""


Probe = Callable[[Case], bool]
"""``probe(candidate)``: ``True`` (and the candidate becomes current) when it keeps the
signature; ``False`` when it does not, is invalid, unsupported or already rejected."""


@dataclass(frozen=True, slots=True)
class ShrinkPass:
    """A named reduction: ``run(case, probe)`` returns the smallest case it reached."""

    name: str
    run: Callable[[Case, Probe], Case]
    expensive: bool = False


def build(make: Callable[..., Case], *args: Any, **kwargs: Any) -> Case | None:
    """``make(*args, **kwargs)``, or ``None`` when the candidate violates a case constraint."""
    try:
        return make(*args, **kwargs)
    except InvalidCase:
        return None


def attempt(case: Case, probe: Probe, make: Callable[..., Case], *args: Any, **kwargs: Any) -> Case:
    """Try one candidate, ``make(*args, **kwargs)``; the new current case (the candidate if
    the probe accepted it, else ``case``)."""
    candidate = build(make, *args, **kwargs)
    if candidate is not None and probe(candidate):
        return candidate
    return case


def first_accepted(case: Case, probe: Probe, makers: Iterable[Callable[[], Case]]) -> Case:
    """Try candidates in order and stop at the first the probe accepts."""
    for make in makers:
        candidate = build(make)
        if candidate is not None and probe(candidate):
            return candidate
    return case


Setter = Callable[[Case, int], Case]


def search_down(case: Case, probe: Probe, current: int, floor: int, setter: Setter) -> Case:
    """The smallest value of one field in ``[floor, current]`` that keeps the failure.

    ``setter(case, value)`` builds the candidate (it may raise ``InvalidCase``). Tries the
    floor, then binary-searches between the largest value known not to fail and the smallest
    known to fail, then steps down by one while the failure holds (for failures that are not
    monotone in the value).
    """
    if current <= floor:
        return case

    candidate = build(setter, case, floor)
    if candidate is not None and probe(candidate):
        return candidate
    lo, hi = floor, current  # lo: rejected, hi: failing (the current case)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = build(setter, case, mid)
        if candidate is not None and probe(candidate):
            case, hi = candidate, mid
        else:
            lo = mid
    while hi - 1 > floor:
        candidate = build(setter, case, hi - 1)
        if candidate is None or not probe(candidate):
            break
        case, hi = candidate, hi - 1
    return case
