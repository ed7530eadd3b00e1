"""Expensive reductions: each candidate is a new compile variant on a GPU.

A chain draft instead of a tree, no window, no sinks, bf16 instead of fp8 or fp16, fewer KV
heads, a smaller GQA group, a smaller head_dim (only where the path supports it: the driver
rejects an unsupported candidate without running it).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from difftest.model.case import Case, CausalDraft, TreeDraft
from difftest.reduction.probe import Probe, attempt, first_accepted, search_down

HEAD_DIMS = (16, 32, 64, 128)
"""Head dims tried, smallest first, below the current one."""
PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Page sizes tried, smallest first, below the current one."""


def with_attention(case: Case, **changes: Any) -> Case:
    return case.replace(attention=dataclasses.replace(case.attention, **changes))


def causal_draft(case: Case, probe: Probe) -> Case:
    if case.batch.draft.kind == "causal":
        return case
    batch = dataclasses.replace(case.batch, draft=CausalDraft())
    return attempt(case, probe, case.replace, batch=batch)


def no_window(case: Case, probe: Probe) -> Case:
    if case.attention.window_left < 0:
        return case
    return attempt(case, probe, lambda: with_attention(case, window_left=-1))


def smaller_window(case: Case, probe: Probe) -> Case:
    """A window kept on, as small as still fails (the window size is a runtime argument of the
    kernels: no new compile variant, unlike switching the window off)."""
    w = case.attention.window_left
    if w <= 0:
        return case
    return search_down(case, probe, w, 0, lambda c, v: with_attention(c, window_left=v))


def no_sinks(case: Case, probe: Probe) -> Case:
    if not case.attention.sinks:
        return case
    return attempt(case, probe, lambda: with_attention(case, sinks=False))


def bf16_everywhere(case: Case, probe: Probe) -> Case:
    """q, KV and output in bf16; else the KV cache in the query dtype (fp8 off); else the
    output in the query dtype."""
    a = case.attention
    if (a.q_dtype, a.kv_dtype, a.out_dtype) == ("bf16", "bf16", "bf16"):
        return case
    return first_accepted(
        case,
        probe,
        [
            lambda: with_attention(case, q_dtype="bf16", kv_dtype="bf16", out_dtype="bf16"),
            lambda: with_attention(case, kv_dtype=a.q_dtype),
            lambda: with_attention(case, out_dtype=a.q_dtype),
        ],
    )


def _kv_heads(case: Case, value: int) -> Case:
    group = case.attention.group_size
    return with_attention(case, num_kv_heads=value, num_qo_heads=value * group)


def _group(case: Case, value: int) -> Case:
    return with_attention(case, num_qo_heads=case.attention.num_kv_heads * value)


def fewer_kv_heads(case: Case, probe: Probe) -> Case:
    """Fewer KV heads at the same GQA ratio."""
    return search_down(case, probe, case.attention.num_kv_heads, 1, _kv_heads)


def smaller_group(case: Case, probe: Probe) -> Case:
    """Fewer query heads per KV head."""
    return search_down(case, probe, case.attention.group_size, 1, _group)


def smaller_head_dim(case: Case, probe: Probe) -> Case:
    dim = case.attention.head_dim
    makers = [functools.partial(with_attention, case, head_dim=d) for d in HEAD_DIMS if d < dim]
    return first_accepted(case, probe, makers)


def smaller_page_size(case: Case, probe: Probe) -> Case:
    """Smaller pages, smallest first: a failure that needs many pages (or a partly filled
    one) then needs fewer tokens, which ``prefix_lens`` removes on the next sweep."""
    ps = case.attention.page_size
    makers = [functools.partial(with_attention, case, page_size=s) for s in PAGE_SIZES if s < ps]
    return first_accepted(case, probe, makers)


def _drop_draft_token(case: Case, k: int) -> Case:
    """The tree draft without token ``k`` (``0 < k < L``): its children hang from its parent."""
    draft = case.batch.draft
    assert isinstance(draft, TreeDraft)
    parents = []
    for i, p in enumerate(draft.parents):
        if i != k:
            p = draft.parents[k] if p == k else p
            parents.append(p - 1 if p > k else p)
    batch = dataclasses.replace(
        case.batch, q_len=case.batch.q_len - 1, draft=TreeDraft(parents=tuple(parents))
    )
    return case.replace(batch=batch)


def fewer_draft_tokens(case: Case, probe: Probe) -> Case:
    """A tree draft one token smaller, whichever token (``q_len`` only cuts the last ones,
    which can turn the tree into a chain)."""
    if not isinstance(case.batch.draft, TreeDraft):
        return case
    makers = [
        functools.partial(_drop_draft_token, case, k) for k in range(case.batch.q_len - 1, 0, -1)
    ]
    return first_accepted(case, probe, makers)
