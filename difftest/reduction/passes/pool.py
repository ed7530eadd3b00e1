"""Shrinking the paged pool and the calling convention toward the plainest layout: no shared
or spare pages, identity page order, an exact zero-filled table, zeroed stale slots, the plain
convention and the HND layout. All runtime shape: no new compile variant."""

from __future__ import annotations

import dataclasses
from typing import Any

from difftest.model.case import Case
from difftest.reduction.probe import Probe, attempt, first_accepted, search_down


def with_pool(case: Case, **changes: Any) -> Case:
    return case.replace(pool=dataclasses.replace(case.pool, **changes))


def no_shared_pages(case: Case, probe: Probe) -> Case:
    return search_down(
        case,
        probe,
        case.pool.shared_prefix_pages,
        0,
        lambda c, v: with_pool(c, shared_prefix_pages=v),
    )


def no_spare_pages(case: Case, probe: Probe) -> Case:
    return search_down(
        case, probe, case.pool.spare_pages, 0, lambda c, v: with_pool(c, spare_pages=v)
    )


def identity_page_order(case: Case, probe: Probe) -> Case:
    if case.pool.page_order == "sequential":
        return case
    return attempt(case, probe, lambda: with_pool(case, page_order="sequential"))


def exact_table(case: Case, probe: Probe) -> Case:
    """An exact-width table and no separate context length; else each of the two alone."""
    pool = case.pool
    if pool.table_width == "exact" and pool.context_len is None:
        return case
    return first_accepted(
        case,
        probe,
        [
            lambda: with_pool(case, table_width="exact", context_len=None),
            lambda: with_pool(case, context_len=None),
            lambda: with_pool(case, table_width="exact"),
        ],
    )


def zero_table_fill(case: Case, probe: Probe) -> Case:
    if case.pool.table_fill == "zero":
        return case
    return attempt(case, probe, lambda: with_pool(case, table_fill="zero"))


def zero_stale_fill(case: Case, probe: Probe) -> Case:
    if case.pool.stale_fill == "zeros":
        return case
    return attempt(case, probe, lambda: with_pool(case, stale_fill="zeros"))


def plain_convention(case: Case, probe: Probe) -> Case:
    if case.convention == "plain":
        return case
    return attempt(case, probe, lambda: case.replace(convention="plain"))


def hnd_storage(case: Case, probe: Probe) -> Case:
    if case.pool.kv_storage == "hnd":
        return case
    return attempt(case, probe, lambda: with_pool(case, kv_storage="hnd"))
