"""Double-bug mutants: one kernel with two independent bugs from different classes.

A :class:`Pair` runs both of its single mutants and the correct kernel, and returns the correct
output plus both mutants' deviations from it. Where neither bug triggers, the output is the
correct one bit for bit; where one triggers, it is that mutant's output; where both do, it
carries both errors. So the pair is a kernel with exactly its two mutants' bugs, and the
self-test can ask of difftest what a real campaign needs: two bugs, two groups, each with its
own trigger and its own minimal case, and neither hiding the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from difftest.calibration.mutants import heads, masking, numerics, paging, scaling
from difftest.calibration.mutants.mutant import MUTANT_TAG, Mutant, _query_dtype_precision
from difftest.model.batch import Batch
from difftest.paths import torch_online
from difftest.paths.registry import KernelPath


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    """Two single mutants' bugs in one kernel."""

    first: Mutant
    second: Mutant

    @property
    def name(self) -> str:
        first, second = (m.name.removeprefix("mutant-") for m in self.parts)
        return f"mutant-pair-{first}+{second}"

    @property
    def parts(self) -> tuple[Mutant, Mutant]:
        return (self.first, self.second)

    def run(self, batch: Batch) -> torch.Tensor:
        right = torch_online.run(batch).double()
        first = self.first.run(batch).double()
        second = self.second.run(batch).double()
        out = batch.new_output()
        out.copy_(right + (first - right) + (second - right))
        return out

    def path(self) -> KernelPath:
        return KernelPath(
            name=self.name,
            run=self.run,
            side="custom",
            precision=_query_dtype_precision,
            description=f"MUTANT PAIR: {self.first.bug}; and {self.second.bug}",
            tags=frozenset({MUTANT_TAG}),
        )


PAIRS: tuple[Pair, ...] = (
    Pair(first=masking.WINDOW_EDGE_EXCLUSIVE, second=scaling.BMM2_IN_SOFTMAX),
    Pair(first=heads.SINKS_IGNORED, second=paging.PARTIAL_LAST_PAGE),
    Pair(first=heads.GQA_MODULO, second=masking.DRAFT_MASK_IGNORED),
    Pair(first=paging.ROW_STRIDE, second=numerics.SPLIT_KV_NO_RESCALE),
)
"""The pairs the self-test measures: a window-edge bug with a scale bug, sinks ignored with a
stale partial page, a GQA mapping bug with a draft-mask bug, misplaced rows with a split-KV
merge bug."""
