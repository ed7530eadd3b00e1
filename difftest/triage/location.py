"""Where a finding's error sits in the paged cache: per wrong request, its lengths and pages,
and per wrong query row the KV positions it may see and the pages holding them.

Computed from the case spec alone (no tensors, no kernel), so a repro file carries it and any
machine can recompute it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from difftest.generation.materialize import page_table as physical_page_table
from difftest.model.case import Case, draft_mask_rows
from difftest.model.outcome import ErrorLocation
from difftest.oracle.attention import visible_keys

Ranges = list[tuple[int, int]]
"""Inclusive ``(first, last)`` KV position ranges."""
MAX_LISTED_PAGES = 256
"""A located request lists at most this many pages (``pages_truncated`` says when cut)."""


def page_table(case: Case) -> torch.Tensor:
    """int64 ``[bs, W]`` physical page of each request's page column (fill past used)."""
    return physical_page_table(case, torch.device("cpu"))


def row_visibility(
    case: Case, request: int, *, window_left: int | None = None, draft_mask: bool = True
) -> torch.Tensor:
    """bool ``[L_b, T_b]``: the KV positions each query row of ``request`` (its ``L_b`` new
    tokens: ``L``, or its own count when ragged) may see, by the oracle's rules
    (:func:`difftest.oracle.attention.visible_keys`) with the case's window (or
    ``window_left``) and draft mask (or, with ``draft_mask=False``, a chain's)."""
    seq = case.batch.seq_lens()[request]
    n = case.batch.new_tokens()[request]  # L, or the request's own count when ragged
    w = case.attention.window_left if window_left is None else window_left
    mask = None
    if draft_mask and case.batch.draft.kind != "causal":
        # A ragged request's draft tokens are the draft's first n: the mask's top-left block.
        rows = draft_mask_rows(case.batch.draft, case.batch.q_len)
        mask = torch.tensor([r[:n] for r in rows[:n]], dtype=torch.bool)
    lens = torch.tensor([seq], dtype=torch.int64)
    return visible_keys(lens, n, seq, window_left=w, draft_mask=mask)[0]


def visible_positions(
    case: Case, request: int, row: int, *, window_left: int | None = None, draft_mask: bool = True
) -> list[int]:
    """The KV positions query row ``row`` of ``request`` may see, ascending (see
    :func:`row_visibility`)."""
    visible = row_visibility(case, request, window_left=window_left, draft_mask=draft_mask)
    return [int(k) for k in visible[row].nonzero().flatten()]


def visible_ranges(case: Case, request: int, row: int) -> Ranges:
    """KV positions query row ``row`` of ``request`` may see (``docs/semantics.md`` §2)."""
    return rows_ranges(case, request, [row])[row]


def rows_ranges(case: Case, request: int, rows: Sequence[int]) -> dict[int, Ranges]:
    """:func:`visible_ranges` of each of ``rows``, from the lengths alone: the rules of
    :func:`row_visibility` (causal, the window, the draft mask) worked out per row in integer
    arithmetic, without the ``[L_b, T_b]`` mask (a repro's location is written for every wrong
    request of every finding, and a mask of a row past ten thousand keys cost the campaign's
    parent several milliseconds a request). A test holds it to :func:`row_visibility`."""
    seq = case.batch.seq_lens()[request]
    n = case.batch.new_tokens()[request]
    w = case.attention.window_left
    first_new = seq - n  # the position of the request's first new token
    mask = None
    if case.batch.draft.kind != "causal":
        mask = draft_mask_rows(case.batch.draft, case.batch.q_len)  # its top-left n x n block
    out: dict[int, Ranges] = {}
    for row in rows:
        pos = first_new + row
        lo = max(0, pos - w) if w >= 0 else 0
        ranges: Ranges = []
        if lo < first_new:
            ranges.append((lo, first_new - 1))  # the prefix: causal, inside the window
        for m in range(row + 1):  # the draft tokens up to this row's own
            key = first_new + m
            if key < lo or (mask is not None and not mask[row][m]):
                continue
            if ranges and ranges[-1][1] == key - 1:
                ranges[-1] = (ranges[-1][0], key)
            else:
                ranges.append((key, key))
        out[row] = ranges
    return out


def ranges_of(visible: torch.Tensor) -> Ranges:
    """The runs of ``True`` in the bool vector ``visible``, as inclusive ``(first, last)``
    position ranges, ascending."""
    keys = visible.nonzero().flatten()
    if keys.numel() == 0:
        return []
    breaks = (keys[1:] != keys[:-1] + 1).nonzero().flatten()
    firsts = torch.cat([keys[:1], keys[breaks + 1]]).tolist()
    lasts = torch.cat([keys[breaks], keys[-1:]]).tolist()
    return list(zip(firsts, lasts, strict=True))


def pages_of(case: Case, table: torch.Tensor, request: int, ranges: Ranges) -> list[int]:
    """Physical pages holding the KV positions ``ranges`` of ``request``, in column order."""
    ps = case.attention.page_size
    cols: set[int] = set()
    for first, last in ranges:
        cols.update(range(first // ps, last // ps + 1))
    row = table[request].tolist()
    return [int(row[c]) for c in sorted(cols)]


@dataclass(frozen=True, slots=True, kw_only=True)
class PageLocation:
    """One wrong request located in the paged cache: the error's location, the request's
    lengths and pages, and per wrong row the KV ranges it may see and the pages holding them."""

    error: ErrorLocation
    padding: bool
    """A CUDA-graph padding request (not one of the batch's real requests)."""
    seq_len: int
    prefix_len: int
    pages: tuple[int, ...]
    visible: dict[int, Ranges]
    visible_pages: tuple[int, ...]
    pages_truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            **self.error.to_json(),
            "padding": self.padding,
            "seq_len": self.seq_len,
            "prefix_len": self.prefix_len,
            "pages": list(self.pages),
            "visible": {str(r): [list(x) for x in v] for r, v in self.visible.items()},
            "visible_pages": list(self.visible_pages),
            "pages_truncated": self.pages_truncated,
        }


def locate_pages(case: Case, errors: Sequence[ErrorLocation]) -> list[PageLocation]:
    """The error locations, each with the request's lengths and pages, and per wrong row the
    visible KV ranges and the pages holding them. (Locations must lie inside the case: a
    repro's are checked when it is read.)"""
    table = page_table(case)
    used = case.pages_per_request()
    seqs = case.batch.seq_lens()
    located = []
    for err in errors:
        b = err.request
        visible = rows_ranges(case, b, err.rows)
        seen: dict[int, None] = {}  # the pages in order of first sight
        for ranges in visible.values():
            seen.update(dict.fromkeys(pages_of(case, table, b, ranges)))
        pages = table[b, : used[b]].tolist()
        located.append(
            PageLocation(
                error=err,
                padding=b >= len(case.batch.prefix_lens),
                seq_len=seqs[b],
                prefix_len=seqs[b] - case.batch.new_tokens()[b],
                pages=tuple(pages[:MAX_LISTED_PAGES]),
                visible=visible,
                visible_pages=tuple(list(seen)[:MAX_LISTED_PAGES]),
                pages_truncated=max(len(pages), len(seen)) > MAX_LISTED_PAGES,
            )
        )
    return located


def check_inside(case: Case, errors: Sequence[ErrorLocation]) -> str | None:
    """Why ``errors`` do not fit ``case`` (a request, row or head it does not have), else
    ``None``."""
    b, a = case.batch, case.attention
    for e in errors:
        if e.request >= b.num_requests:
            return f"request {e.request} of a case with {b.num_requests} requests"
        if any(r >= b.new_tokens()[e.request] for r in e.rows):
            return f"request {e.request}: a row >= its {b.new_tokens()[e.request]} new tokens"
        if any(h >= a.num_qo_heads for h in e.heads):
            return f"request {e.request}: a head >= num_qo_heads={a.num_qo_heads}"
    return None
