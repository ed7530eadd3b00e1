"""Bugs that take the process with them: an out-of-bounds write that aborts, and a deadlock.

These two can only run in an isolated worker (:mod:`difftest.execution.isolation`): in the calling
process the first kills it and the second never returns.
"""

from __future__ import annotations

import os
import threading

import torch

from difftest.calibration.mutants.kernel import attend, emit, pages_used
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.model.outcome import Outcome
from difftest.paths.torch_online import unpack

STAGED_PAGES = 16
"""Entries of the buffer the crashing kernel stages one request's page ids in."""

CONSUMER_WARPS = 8
"""Query heads the deadlocking kernel serves per KV head (one consumer warp each)."""


def _abort_on_long_table(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    ps = batch.case.attention.page_size
    if int(pages_used(x, ps).max()) > STAGED_PAGES:
        # The bug: a request's page ids are copied into a fixed buffer of STAGED_PAGES
        # entries; a longer request writes past it (on a GPU an illegal memory access, here
        # the process dies the same way: at once, with no Python exception).
        os.abort()
    return emit(batch, attend(x, ps))


CRASH_LONG_TABLE = Mutant(
    name="mutant-crash-long-table",
    bug_class="illegal memory access (crash)",
    bug=f"page ids staged in a {STAGED_PAGES}-entry buffer: longer requests abort the process",
    trigger=f"a request with more than {STAGED_PAGES} pages",
    run=_abort_on_long_table,
    minimal=Tiny(prefix_lens=(STAGED_PAGES,)).case(),
    harmless=Tiny(prefix_lens=(STAGED_PAGES - 2, 3), q_len=2).case(),
    detected_as=frozenset({Outcome.CRASH}),
    isolated=True,
)


def _deadlock_on_large_group(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    if x.group_size > CONSUMER_WARPS:
        # The bug: the producer waits on a barrier for one arrival per query head of the
        # group, but only CONSUMER_WARPS consumers exist; the rest never arrive.
        threading.Event().wait()
    return emit(batch, attend(x, batch.case.attention.page_size))


HANG_LARGE_GROUP = Mutant(
    name="mutant-hang-large-group",
    bug_class="hang (deadlock)",
    bug=f"a barrier expects one arrival per query head of a group, only {CONSUMER_WARPS} come",
    trigger=f"a GQA group of more than {CONSUMER_WARPS} query heads per KV head",
    run=_deadlock_on_large_group,
    minimal=Tiny(heads=(CONSUMER_WARPS + 1, 1)).case(),
    harmless=Tiny(prefix_lens=(2, 5), q_len=2, heads=(CONSUMER_WARPS, 1), page_size=2).case(),
    detected_as=frozenset({Outcome.HANG}),
    isolated=True,
)

MUTANTS = (CRASH_LONG_TABLE, HANG_LARGE_GROUP)
