"""Reduction bugs: split-KV merges that are wrong past some length, or differ between runs."""

from __future__ import annotations

import itertools

import torch

from difftest.calibration.mutants.kernel import (
    Partial,
    attend,
    emit,
    finish,
    merge,
    pages_used,
    partial,
)
from difftest.calibration.mutants.kernel import with_sinks as fold_sinks
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.model.outcome import Outcome
from difftest.paths.torch_online import unpack

SPLIT_PAGES = 8
"""Pages one split-KV pass (one CTA) covers; longer requests are split."""


def _split_without_rescale(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    ps = batch.case.attention.page_size
    n = int(pages_used(x, ps).max())
    if n <= SPLIT_PAGES:
        return emit(batch, attend(x, ps))
    parts = [partial(x, ps, range(c, min(c + SPLIT_PAGES, n))) for c in range(0, n, SPLIT_PAGES)]
    m = parts[0].m
    for p in parts[1:]:
        m = torch.maximum(m, p.m)
    # The bug: the split partials are summed without rescaling each to the common maximum
    # (exp(m_i - m) is dropped), right only when every split has the same maximum.
    state = Partial(
        m=m,
        denom=torch.stack([p.denom for p in parts]).sum(0),
        acc=torch.stack([p.acc for p in parts]).sum(0),
    )
    return emit(batch, finish(x, state))


SPLIT_KV_NO_RESCALE = Mutant(
    name="mutant-split-kv-no-rescale",
    bug_class="split-KV reduction wrong at long lengths",
    bug=f"past {SPLIT_PAGES} pages the split-KV merge drops the exp(m_i - m) rescale",
    trigger=f"a row that sees keys in more than {SPLIT_PAGES} page columns",
    run=_split_without_rescale,
    minimal=Tiny(prefix_lens=(SPLIT_PAGES,)).case(),
    harmless=Tiny(prefix_lens=(SPLIT_PAGES - 2, 3), q_len=2).case(),
)

_WORKSPACE_SEMAPHORE = itertools.count()
"""A counter the kernel keeps in its workspace and never resets between calls."""


def _racy_merge(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    ps = batch.case.attention.page_size
    n = int(pages_used(x, ps).max())
    if n < 2:
        return emit(batch, attend(x, ps))
    half = (n + 1) // 2
    parts = (partial(x, ps, range(half)), partial(x, ps, range(half, n)))
    total = fold_sinks(x, merge(parts))
    safe = torch.where(torch.isinf(total.m), 0.0, total.m)
    norm = torch.where(total.denom > 0, x.bmm2_scale / total.denom.clamp_min(1e-30), 0.0)
    first, second = (p.acc * torch.exp(p.m - safe) * norm for p in parts)
    # The bug: the two split CTAs add their share straight into the output, in the order they
    # finish; which one goes first is decided by a semaphore left in the workspace by the
    # previous call. The first share is rounded to the output dtype before the second is
    # added, so identical calls round differently.
    if next(_WORKSPACE_SEMAPHORE) % 2:
        first, second = second, first
    dtype = batch.out_dtype
    out = (first.to(dtype).float() + second).to(dtype)
    return emit(batch, out.float())


RACY_SPLIT_MERGE = Mutant(
    name="mutant-racy-split-merge",
    bug_class="race: results change between identical runs",
    bug="two split-KV halves are added into the output in arrival order (rounding differs)",
    trigger="a row that sees keys on both halves of its request's pages (2+ pages)",
    run=_racy_merge,
    # Two one-token pages and one row: about a third of a row's elements round differently
    # in the two orders, so some of its 16 do (the unit tests hold this case to that).
    minimal=Tiny(prefix_lens=(1,)).case(),
    harmless=Tiny(prefix_lens=(3, 1), q_len=2, page_size=8).case(),
    detected_as=frozenset({Outcome.NONDETERMINISTIC}),
)

MUTANTS = (SPLIT_KV_NO_RESCALE, RACY_SPLIT_MERGE)
