"""Shrinking lengths: prefixes (cheap, runtime shape) and ``L`` (a new compile variant)."""

from __future__ import annotations

import dataclasses

from difftest.model.case import Case, TreeDraft
from difftest.reduction.passes.requests import with_prefixes
from difftest.reduction.probe import Probe, Setter, attempt, build, search_down


def _prefix_setter(index: int) -> Setter:
    def setter(case: Case, value: int) -> Case:
        lens = list(case.batch.prefix_lens)
        lens[index] = value
        return with_prefixes(case, tuple(lens))

    return setter


def shrink_prefixes(case: Case, probe: Probe) -> Case:
    """Every prefix to the floor at once; then each prefix: the page boundary below it, then
    the smallest failing value (binary search, then single steps).

    The floor is the shared prefix (its pages must lie inside every prefix); the shared pages
    themselves shrink in their own pass.
    """
    ps = case.attention.page_size
    floor = case.pool.shared_prefix_pages * ps
    n = len(case.batch.prefix_lens)
    case = attempt(case, probe, with_prefixes, case, (floor,) * n)
    for b in range(len(case.batch.prefix_lens)):
        p = case.batch.prefix_lens[b]
        setter = _prefix_setter(b)
        boundary = ps * ((p - 1) // ps) if p > 0 else 0
        if floor < boundary < p:
            case = attempt(case, probe, setter, case, boundary)
        case = search_down(case, probe, case.batch.prefix_lens[b], floor, setter)
    return case


def with_q_len(case: Case, q_len: int) -> Case:
    """``L = q_len``; a tree draft keeps the parents of its first ``q_len`` tokens; a ragged
    request keeps at most ``q_len`` new tokens."""
    b = case.batch
    if b.q_lens is not None:
        counts = tuple(min(n, q_len) for n in b.q_lens)
        if max(counts) == q_len:
            return case.replace(batch=b.with_real_requests(b.prefix_lens, counts))
        b = dataclasses.replace(b, q_lens=None)  # every request had fewer: uniform L
        case = case.replace(batch=b)
    draft = case.batch.draft
    if isinstance(draft, TreeDraft):
        draft = TreeDraft(parents=draft.parents[:q_len])
    return case.replace(batch=dataclasses.replace(case.batch, q_len=q_len, draft=draft))


def shrink_q_len(case: Case, probe: Probe) -> Case:
    """``L`` down to the smallest failing value (at least 1)."""
    return search_down(case, probe, case.batch.q_len, 1, with_q_len)


def _shift_into_prefix(case: Case, steps: int) -> Case:
    """``L - steps`` new tokens and every prefix ``steps`` longer: the same KV lengths, fewer
    query rows."""
    lens = tuple(p + steps for p in case.batch.prefix_lens)
    return with_q_len(with_prefixes(case, lens), case.batch.q_len - steps)


def trade_q_len_for_prefix(case: Case, probe: Probe) -> Case:
    """Move new tokens into the prefixes one at a time (for failures that need a KV length, not
    a number of query rows, which the separate ``L`` and prefix passes cannot reach)."""
    while case.batch.q_len > 1:
        candidate = build(_shift_into_prefix, case, 1)
        if candidate is None or not probe(candidate):
            break
        case = candidate
    return case
