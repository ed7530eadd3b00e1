"""Metadata mismatches: what the caller builds is not what the kernel assumes.

The class behind the production crash (``docs/semantics.md`` §1): sequence lengths without
the new tokens, a page table one page short, and query rows padded for data-parallel attention
that a decode kernel counts as requests.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.calibration.mutants.kernel import attend, emit
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.model.case import PoolSpec
from difftest.model.outcome import Outcome
from difftest.paths.torch_online import unpack


def _prefix_only_seq_lens(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    if batch.case.batch.mode == "draft_extend_v2":
        # The bug: the DRAFT_EXTEND_V2 metadata builder passes the committed prefix lengths,
        # as the draft model's own bookkeeping holds them, where the kernel wants P_b + L.
        x = dataclasses.replace(x, seq_lens=x.seq_lens - batch.q_len)
    return emit(batch, attend(x, batch.case.attention.page_size))


SEQ_LENS_PREFIX_ONLY = Mutant(
    name="mutant-seq-lens-prefix-only",
    bug_class="sequence lengths without the new tokens",
    bug="draft_extend_v2 passes seq_lens = P_b instead of P_b + L",
    trigger="any draft_extend_v2 batch",
    run=_prefix_only_seq_lens,
    minimal=Tiny(mode="draft_extend_v2").case(),
    harmless=Tiny(mode="target_verify", prefix_lens=(5, 2), q_len=3, page_size=4).case(),
)


def _table_one_page_short(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    ps = batch.case.attention.page_size
    # The bug: pages counted as (T - 1) // page_size, one short of ceil(T / page_size); the
    # builder leaves the last used column as the zeroed allocation (page 0).
    counted = (x.seq_lens - 1) // ps
    col = torch.arange(x.table.shape[1], device=x.table.device).view(1, -1)
    table = torch.where(col < counted.view(-1, 1), x.table, 0)
    return emit(batch, attend(dataclasses.replace(x, table=table), ps))


TABLE_ONE_PAGE_SHORT = Mutant(
    name="mutant-table-one-page-short",
    bug_class="page table one page short",
    bug="the last used page-table column is left zero (pages counted as (T-1)//page_size)",
    trigger="a request whose last page is not physical page 0",
    run=_table_one_page_short,
    # One request on one page: the pool must put that page somewhere other than page 0.
    minimal=Tiny(pool=PoolSpec(page_order="reversed", spare_pages=1)).case(),
    # One request whose only page is physical page 0: zeroing its column changes nothing.
    harmless=Tiny(prefix_lens=(2,), q_len=2, page_size=8).case(),
)


def _padded_rows_as_requests(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    a = batch.case.attention
    L = batch.q_len
    # The bug: the batch size is inferred as query rows // L, counting the rows padded for
    # data-parallel attention as requests; their lengths and page-table rows are read past
    # the end of seq_lens and block_tables (an out-of-bounds read).
    bs = batch.q_padded.shape[0] // L
    q = batch.q_padded[: bs * L].float().view(bs, L, a.num_qo_heads, a.head_dim).transpose(1, 2)
    rows = torch.arange(bs, device=batch.device)
    x = dataclasses.replace(x, q=q, table=x.table[rows], seq_lens=x.seq_lens[rows])
    return emit(batch, attend(x, a.page_size))


PADDED_ROWS_AS_REQUESTS = Mutant(
    name="mutant-padded-rows-as-requests",
    bug_class="padded query rows counted as requests",
    bug="batch size inferred as q rows // L, padding rows included: metadata read out of bounds",
    trigger="data-parallel padding of at least L query rows",
    run=_padded_rows_as_requests,
    minimal=Tiny(padding_rows=1).case(),
    harmless=Tiny(prefix_lens=(3, 1), q_len=3, padding_rows=2, page_size=2).case(),
    detected_as=frozenset({Outcome.RAISED, Outcome.WRONG, Outcome.CRASH}),
)

MUTANTS = (SEQ_LENS_PREFIX_ONLY, TABLE_ONE_PAGE_SHORT, PADDED_ROWS_AS_REQUESTS)
