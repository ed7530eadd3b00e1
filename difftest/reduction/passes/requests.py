"""Shrinking the batch: fewer requests, no CUDA-graph padding requests or padding rows."""

from __future__ import annotations

import dataclasses

from difftest.model.case import Case
from difftest.reduction.probe import Probe, attempt, build, search_down


def with_prefixes(case: Case, prefix_lens: tuple[int, ...]) -> Case:
    return case.replace(batch=dataclasses.replace(case.batch, prefix_lens=prefix_lens))


def without_requests(case: Case, start: int, count: int) -> Case:
    """``case`` without real requests ``start .. start + count - 1`` (a ragged batch loses
    their new-token counts too, and may become uniform)."""
    b = case.batch
    lens = b.prefix_lens[:start] + b.prefix_lens[start + count :]
    if not b.is_ragged:
        return with_prefixes(case, lens)
    assert b.q_lens is not None
    counts = b.q_lens[:start] + b.q_lens[start + count :]
    return case.replace(batch=b.with_real_requests(lens, counts))


def drop_requests(case: Case, probe: Probe) -> Case:
    """Drop runs of requests: halves first, then quarters, down to single requests.

    After a drop the same position is tried again (the requests behind moved up).
    """
    chunk = max(1, len(case.batch.prefix_lens) // 2)
    while chunk >= 1:
        i = 0
        while i < len(case.batch.prefix_lens):
            lens = case.batch.prefix_lens
            kept = lens[:i] + lens[i + chunk :]
            candidate = build(without_requests, case, i, chunk) if kept else None
            if candidate is not None and probe(candidate):
                case = candidate
            else:
                i += chunk
        chunk //= 2
    return case


def _padding_requests(case: Case, value: int) -> Case:
    return case.replace(batch=dataclasses.replace(case.batch, padding_requests=value))


def _padding_rows(case: Case, value: int) -> Case:
    return case.replace(batch=dataclasses.replace(case.batch, padding_rows=value))


def drop_padding(case: Case, probe: Probe) -> Case:
    """CUDA-graph padding requests, then data-parallel padding rows, toward zero."""
    case = search_down(case, probe, case.batch.padding_requests, 0, _padding_requests)
    return search_down(case, probe, case.batch.padding_rows, 0, _padding_rows)


def real_for_padding(case: Case, probe: Probe) -> Case:
    """CUDA-graph padding requests (prefix 1) become real requests without a prefix: the same
    batch size, one KV token fewer each (for failures that need a second request)."""
    n = case.batch.padding_requests
    if n == 0:
        return case
    b = case.batch
    q_lens = None if b.q_lens is None else b.q_lens + (b.q_len,) * n
    batch = dataclasses.replace(
        b, prefix_lens=b.prefix_lens + (0,) * n, padding_requests=0, q_lens=q_lens
    )
    return attempt(case, probe, case.replace, batch=batch)
