"""Per-head bugs: sinks and the GQA mapping from query heads to KV heads."""

from __future__ import annotations

import dataclasses

import torch

from difftest.calibration.mutants.kernel import attend, emit
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.paths.torch_online import unpack


def _sinks_per_kv_head(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    if x.sinks is not None:
        # The bug: the sink is looked up with the KV head index (h // group), not h.
        heads = torch.arange(x.sinks.numel(), device=batch.device)
        x = dataclasses.replace(x, sinks=x.sinks[heads // x.group_size])
    return emit(batch, attend(x, batch.case.attention.page_size))


SINKS_PER_KV_HEAD = Mutant(
    name="mutant-sinks-per-kv-head",
    bug_class="sinks indexed per KV head",
    bug="query head h uses sink[h // group] instead of sink[h]",
    trigger="sinks with a GQA group of 2 or more",
    run=_sinks_per_kv_head,
    minimal=Tiny(heads=(2, 1), sinks=True).case(),
    harmless=Tiny(prefix_lens=(3,), q_len=2, heads=(2, 2), sinks=True, page_size=2).case(),
)


def _sinks_ignored(batch: Batch) -> torch.Tensor:
    # The bug: the sinks argument is accepted and dropped (as fa2/fa3 wrappers do).
    x = dataclasses.replace(unpack(batch), sinks=None)
    return emit(batch, attend(x, batch.case.attention.page_size))


SINKS_IGNORED = Mutant(
    name="mutant-sinks-ignored",
    bug_class="sinks ignored",
    bug="the sinks argument is accepted and ignored",
    trigger="any case with sinks",
    run=_sinks_ignored,
    minimal=Tiny(sinks=True).case(),
    harmless=Tiny(prefix_lens=(3, 0), q_len=2, heads=(4, 2), page_size=2).case(),
)


def _modulo_heads(pages: torch.Tensor, group: int) -> torch.Tensor:
    # The bug: query head h reads KV head h % H_kv (tiled) instead of h // group.
    return pages.repeat(1, group, 1, 1)


def _gqa_modulo(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    return emit(batch, attend(x, batch.case.attention.page_size, heads=_modulo_heads))


GQA_MODULO = Mutant(
    name="mutant-gqa-modulo",
    bug_class="GQA head mapping",
    bug="query head h reads KV head h % H_kv instead of h // (H_q / H_kv)",
    trigger="at least two KV heads, each shared by at least two query heads",
    run=_gqa_modulo,
    minimal=Tiny(heads=(4, 2)).case(),
    harmless=Tiny(prefix_lens=(2, 3), q_len=2, heads=(8, 1), page_size=2).case(),
)

MUTANTS = (SINKS_PER_KV_HEAD, SINKS_IGNORED, GQA_MODULO)
