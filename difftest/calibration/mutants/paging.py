"""Paging and indexing bugs: which pool slots are read, and where output rows are written."""

from __future__ import annotations

import dataclasses

import torch

from difftest.calibration.mutants.kernel import attend, emit
from difftest.calibration.mutants.mutant import WRONG, Mutant, Tiny
from difftest.model.batch import Batch
from difftest.model.outcome import Outcome
from difftest.paths.torch_online import OnlineInputs, unpack


def _mask_only_visibility(x: OnlineInputs, keys: torch.Tensor) -> torch.Tensor:
    bs, _, L, _ = x.q.shape
    dev = x.q.device
    key = keys.view(1, 1, -1)
    seq = x.seq_lens.view(bs, 1, 1)
    row = torch.arange(L, device=dev).view(1, L, 1)
    draft = key - (seq - L)
    # The bug: causality comes from the draft mask alone, looked up at the draft index clamped
    # to the block, and nothing bounds keys by seq_len: the slots after the last token of a
    # partly filled last page are seen by every row that sees draft token L - 1.
    visible = (draft < 0) | x.draft_mask[row, draft.clamp(0, L - 1)]
    if x.window_left >= 0:
        visible &= key >= seq - L + row - x.window_left
    return visible.unsqueeze(1)


def _partial_last_page(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    ps = batch.case.attention.page_size
    return emit(batch, attend(x, ps, visibility=_mask_only_visibility))


PARTIAL_LAST_PAGE = Mutant(
    name="mutant-partial-last-page",
    bug_class="last partial page: stale slots attended",
    bug="keys are not bounded by seq_len: the stale tail of a partly filled last page is seen",
    trigger="a request whose length is not a multiple of the page size",
    run=_partial_last_page,
    minimal=Tiny(page_size=2).case(),
    harmless=Tiny(prefix_lens=(2, 6), q_len=2, page_size=4, heads=(2, 1)).case(),
)


def _longest_for_all(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    # The bug: the kernel runs every request over the batch's longest length (one KV loop
    # bound and one causal offset for the whole batch), so a shorter request reads page-table
    # columns past its used ones, and the stale slots and pages they point to.
    longest = torch.full_like(x.seq_lens, int(x.seq_lens.max()))
    x = dataclasses.replace(x, seq_lens=longest)
    return emit(batch, attend(x, batch.case.attention.page_size))


READS_PAST_USED_COLUMNS = Mutant(
    name="mutant-reads-past-used-columns",
    bug_class="page-table columns past the used pages read",
    bug="every request is run over the longest length: columns past its pages are read",
    trigger="requests of different lengths (CUDA-graph padding requests included)",
    run=_longest_for_all,
    # Requests of one and two tokens on two-token pages: the first one reads the stale second
    # slot of its page. (With one-token pages it would read the zero-filled column past its
    # page, which points to its own page: the same key again, and the same output.)
    minimal=Tiny(prefix_lens=(0, 1), page_size=2).case(),
    harmless=Tiny(prefix_lens=(3, 3), q_len=2, page_size=2, padding_rows=1).case(),
    detected_as=WRONG | {Outcome.RAISED, Outcome.CRASH},
)


def _request_stride(batch: Batch) -> torch.Tensor:
    out = attend(unpack(batch), batch.case.attention.page_size)
    bs, L = out.shape[0], out.shape[2]
    rows = out.transpose(1, 2)  # [bs, L, H_q, D]
    result = batch.new_output()
    # The bug: the epilogue advances the output by the kernel's query tile (L rounded up to a
    # power of two) per request instead of L; rows past the end are dropped, gaps stay unset.
    tile = 1 << (L - 1).bit_length()
    total = result.shape[0]
    for b in range(bs):
        start = b * tile
        n = min(L, total - start)
        if n > 0:
            result[start : start + n] = rows[b, :n].to(result.dtype)
    return result


ROW_STRIDE = Mutant(
    name="mutant-row-stride",
    bug_class="outputs of requests after the first misplaced (row stride)",
    bug="request b's rows are written at b * next_pow2(L) instead of b * L",
    trigger="two or more requests with L not a power of two",
    run=_request_stride,
    minimal=Tiny(prefix_lens=(0, 0), q_len=3).case(),
    harmless=Tiny(prefix_lens=(3, 1, 4), q_len=4, page_size=2).case(),
)

MUTANTS = (PARTIAL_LAST_PAGE, READS_PAST_USED_COLUMNS, ROW_STRIDE)
