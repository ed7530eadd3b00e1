"""The reduction passes and the search helpers they share.

A pass is ``run(case, probe) -> Case``: it proposes smaller candidates, keeps each one the
probe accepts, and returns where it got. Candidates are built through :func:`build`, which
turns an :class:`~difftest.model.errors.InvalidCase` into "no candidate" (rejected without a run).
Numeric fields shrink with :func:`search_down`: straight to the floor, else a binary search
for the smallest failing value, then single steps down (the probe caches what it has already
seen, so steps over known values cost nothing).

:func:`default_passes` is the order the driver runs them in: cheap passes first (the runtime
shape: requests, lengths, pool, values), then the expensive ones (each candidate is a new
compile variant on a GPU: ``L``, masks, dtypes, heads, head_dim).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from difftest.model.case import Case
from difftest.model.errors import InvalidCase
from difftest.model.outcome import Outcome
from difftest.reduction.driver import Probe, ShrinkPass


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


VALUE_DEPENDENT = frozenset({Outcome.NONDETERMINISTIC})
"""Failures whose visibility depends on the values, for which the shrinker also moves lengths
and the seed together."""


def default_passes(kind: Outcome | None = None) -> list[ShrinkPass]:
    """Every pass, cheapest first (plus joint length-and-seed moves for ``VALUE_DEPENDENT``
    failures)."""
    from difftest.reduction import config, lengths, pool, requests, values

    reseed = [ShrinkPass("reseeded_prefixes", values.reseeded_prefixes)]
    return [
        ShrinkPass("drop_requests", requests.drop_requests),
        ShrinkPass("drop_padding", requests.drop_padding),
        ShrinkPass("real_for_padding", requests.real_for_padding),
        ShrinkPass("prefix_lens", lengths.shrink_prefixes),
        ShrinkPass("shared_prefix_pages", pool.no_shared_pages),
        ShrinkPass("spare_pages", pool.no_spare_pages),
        ShrinkPass("page_order", pool.identity_page_order),
        ShrinkPass("table_width", pool.exact_table),
        ShrinkPass("table_fill", pool.zero_table_fill),
        ShrinkPass("stale_fill", pool.zero_stale_fill),
        ShrinkPass("convention", pool.plain_convention),
        ShrinkPass("kv_storage", pool.hnd_storage),
        ShrinkPass("window_left", config.smaller_window),
        ShrinkPass("value_family", values.simplest_values),
        ShrinkPass("scales", values.default_scales),
        ShrinkPass("seed", values.small_seed),
        *(reseed if kind in VALUE_DEPENDENT else []),
        ShrinkPass("q_len", lengths.shrink_q_len, expensive=True),
        ShrinkPass("q_len_into_prefix", lengths.trade_q_len_for_prefix, expensive=True),
        ShrinkPass("draft", config.causal_draft, expensive=True),
        ShrinkPass("draft_tokens", config.fewer_draft_tokens, expensive=True),
        ShrinkPass("window", config.no_window, expensive=True),
        ShrinkPass("sinks", config.no_sinks, expensive=True),
        ShrinkPass("dtypes", config.bf16_everywhere, expensive=True),
        ShrinkPass("kv_heads", config.fewer_kv_heads, expensive=True),
        ShrinkPass("group_size", config.smaller_group, expensive=True),
        ShrinkPass("head_dim", config.smaller_head_dim, expensive=True),
        ShrinkPass("page_size", config.smaller_page_size, expensive=True),
    ]
