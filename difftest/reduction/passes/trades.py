"""Trades: a shorter prefix, or one request fewer, bought with a runtime feature that lets a bug
show on less.

The other passes only move a case toward the defaults. Some bugs have several forms, and the
smallest is not reachable that way: a scale applied twice to the logits needs two keys to show
(softmax does not see a scale on one key), the same scale on the output shows with one; a page
table missing its last page shows on one page only when that page is not physical page 0 (a
second request is then what put the other's page elsewhere). A trade tries, for each request,
the prefix one token shorter, or the batch without that request, *together with* one such
enabling change, and keeps the first candidate that still fails the same way. The case gets
smaller (fewer KV tokens); the trigger then names the enabling feature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from difftest.model.case import Case
from difftest.reduction.passes.requests import with_prefixes, without_requests
from difftest.reduction.probe import Probe, build

Enabler = Callable[[Case], Case | None]


def _logit_scale_to_output(case: Case) -> Case | None:
    """The one non-default logit scale (``q_scale``, ``k_scale``) moved to ``v_scale``."""
    a = case.attention
    if a.v_scale != 1.0 or a.o_scale != 1.0:
        return None
    for name in ("k_scale", "q_scale"):
        value = getattr(a, name)
        if value != 1.0:
            attention = dataclasses.replace(a, **{name: 1.0, "v_scale": value})
            return case.replace(attention=attention)
    return None


def _page_elsewhere(case: Case) -> Case | None:
    """Pages in reverse order with one spare page, so no request's pages start at page 0."""
    pool = case.pool
    if pool.page_order == "reversed" and pool.spare_pages >= 1:
        return None
    changed = dataclasses.replace(pool, page_order="reversed", spare_pages=max(1, pool.spare_pages))
    return case.replace(pool=changed)


ENABLERS: tuple[Enabler, ...] = (_logit_scale_to_output, _page_elsewhere)


def trade_prefix(case: Case, probe: Probe) -> Case:
    """For each request with a prefix, the prefix one token shorter with each enabler in
    turn (the prefix pass then takes it the rest of the way)."""
    ps = case.attention.page_size
    floor = case.pool.shared_prefix_pages * ps
    for b in range(len(case.batch.prefix_lens)):
        p = case.batch.prefix_lens[b]
        if p <= floor:
            continue
        lens = list(case.batch.prefix_lens)
        lens[b] = p - 1
        for enable in ENABLERS:
            enabled = enable(case)
            if enabled is None:
                continue
            candidate = build(with_prefixes, enabled, tuple(lens))
            if candidate is not None and probe(candidate):
                return trade_prefix(candidate, probe)
    return case


def trade_request(case: Case, probe: Probe) -> Case:
    """For a batch of two or more requests, each request dropped with each enabler in turn
    (what ``drop_requests`` cannot do alone when the request left only failed because of
    where the dropped one put its pages)."""
    if len(case.batch.prefix_lens) < 2:
        return case
    for b in range(len(case.batch.prefix_lens)):
        for enable in ENABLERS:
            enabled = enable(case)
            if enabled is None:
                continue
            candidate = build(without_requests, enabled, b, 1)
            if candidate is not None and probe(candidate):
                return trade_request(candidate, probe)
    return case
