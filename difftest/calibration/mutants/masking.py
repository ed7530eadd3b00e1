"""Masking bugs: which keys a query row may see (causal offset, window edge, draft mask)."""

from __future__ import annotations

import dataclasses

import torch

from difftest.calibration.mutants.kernel import attend, emit
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.model.case import TreeDraft
from difftest.paths.torch_online import OnlineInputs, tile_visibility, unpack


def _grid(x: OnlineInputs, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(key [1,1,n], seq [bs,1,1], row [1,L,1])`` coordinates of one tile."""
    bs, _, L, _ = x.q.shape
    dev = x.q.device
    return keys.view(1, 1, -1), x.seq_lens.view(bs, 1, 1), torch.arange(L, device=dev).view(1, L, 1)


def _off_by_one_causal(x: OnlineInputs, keys: torch.Tensor) -> torch.Tensor:
    key, seq, row = _grid(x, keys)
    L = x.q.shape[2]
    pos = seq - L + row
    # The bug: the causal test inside the draft block is ``key <= pos + 1`` (the bonus token
    # is not counted among the L new tokens); keys are still bounded by seq_len.
    visible = (key <= pos + 1) & (key < seq)
    if x.window_left >= 0:
        visible &= key >= pos - x.window_left
    return visible.unsqueeze(1)


def _causal_off_by_one(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    # A chain draft takes the kernel's built-in causal mask; a tree draft takes its mask.
    visibility = _off_by_one_causal if batch.is_chain_draft else tile_visibility
    return emit(batch, attend(x, batch.case.attention.page_size, visibility=visibility))


CAUSAL_OFF_BY_ONE = Mutant(
    name="mutant-causal-off-by-one",
    bug_class="causal offset inside the draft block",
    bug="chain drafts: row i sees draft token i + 1 (causal test off by one)",
    trigger="a chain draft with L >= 2",
    run=_causal_off_by_one,
    minimal=Tiny(q_len=2).case(),
    harmless=Tiny(prefix_lens=(4, 0), q_len=1, page_size=2, window_left=2).case(),
)


def _exclusive_edge(x: OnlineInputs, keys: torch.Tensor) -> torch.Tensor:
    key, seq, row = _grid(x, keys)
    L = x.q.shape[2]
    pos = seq - L + row
    visible = key <= pos
    if x.window_left >= 0:
        visible &= key > pos - x.window_left  # the bug: the window's left edge excluded
    draft = key - (seq - L)
    allowed = x.draft_mask[row, draft.clamp(0, L - 1)]
    return (visible & ((draft < 0) | allowed)).unsqueeze(1)


def _window_edge_exclusive(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    return emit(batch, attend(x, batch.case.attention.page_size, visibility=_exclusive_edge))


WINDOW_EDGE_EXCLUSIVE = Mutant(
    name="mutant-window-edge-exclusive",
    bug_class="sliding window edge",
    bug="the window keeps keys j > p - W instead of j >= p - W",
    trigger="a window that cuts some row's keys (W <= p_i)",
    run=_window_edge_exclusive,
    minimal=Tiny(window_left=0).case(),
    harmless=Tiny(prefix_lens=(3, 1), q_len=2, window_left=5, page_size=2).case(),
)


def _last_row_window(x: OnlineInputs, keys: torch.Tensor) -> torch.Tensor:
    key, seq, _ = _grid(x, keys)
    visible = tile_visibility(x, keys).squeeze(1)
    if x.window_left >= 0:
        # The bug: the window is measured from the request's last position for every row.
        visible &= key >= seq - 1 - x.window_left
    return visible.unsqueeze(1)


def _window_from_last_row(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    return emit(batch, attend(x, batch.case.attention.page_size, visibility=_last_row_window))


WINDOW_FROM_LAST_ROW = Mutant(
    name="mutant-window-from-last-row",
    bug_class="sliding window measured from the wrong position",
    bug="every row's window starts at T - 1 - W (the last row's), not at p_i - W",
    trigger="a window with L >= 2 that cuts the keys of a row before the last",
    run=_window_from_last_row,
    minimal=Tiny(q_len=2, window_left=0).case(),
    harmless=Tiny(prefix_lens=(2, 5), q_len=1, window_left=1, page_size=2).case(),
)


def _draft_mask_ignored(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    L = batch.q_len
    # The bug: the tree mask argument is dropped; every draft gets plain causal masking.
    chain = torch.ones(L, L, dtype=torch.bool, device=batch.device).tril()
    x = dataclasses.replace(x, draft_mask=chain)
    return emit(batch, attend(x, batch.case.attention.page_size))


DRAFT_MASK_IGNORED = Mutant(
    name="mutant-draft-mask-ignored",
    bug_class="draft (tree) mask ignored",
    bug="the tree mask is ignored: tree drafts are masked as chains",
    trigger="a tree draft in which some token's parent is not the token before it",
    run=_draft_mask_ignored,
    minimal=Tiny(q_len=3, draft=TreeDraft(parents=(-1, 0, 0))).case(),
    harmless=Tiny(prefix_lens=(3,), q_len=3, draft=TreeDraft(parents=(-1, 0, 1))).case(),
)

MUTANTS = (CAUSAL_OFF_BY_ONE, WINDOW_EDGE_EXCLUSIVE, WINDOW_FROM_LAST_ROW, DRAFT_MASK_IGNORED)
