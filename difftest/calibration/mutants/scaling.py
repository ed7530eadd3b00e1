"""Scale bugs: ``bmm1_scale``, ``bmm2_scale`` and the fp8 dequantisation scales misapplied."""

from __future__ import annotations

import dataclasses

import torch

from difftest.calibration.mutants.kernel import attend, emit
from difftest.calibration.mutants.mutant import Mutant, Tiny
from difftest.model.batch import Batch
from difftest.paths.torch_online import unpack


def _bmm2_in_softmax(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    # The bug: bmm2_scale (v_scale / o_scale) is folded into the logit scale with bmm1_scale
    # instead of scaling the output.
    x = dataclasses.replace(x, bmm1_scale=x.bmm1_scale * x.bmm2_scale, bmm2_scale=1.0)
    return emit(batch, attend(x, batch.case.attention.page_size))


BMM2_IN_SOFTMAX = Mutant(
    name="mutant-bmm2-in-softmax",
    bug_class="scales applied in the wrong place",
    bug="bmm2_scale multiplies the logits instead of the output",
    trigger="bmm2_scale != 1 (v_scale != o_scale)",
    run=_bmm2_in_softmax,
    minimal=Tiny(v_scale=2.0).case(),
    harmless=Tiny(prefix_lens=(3, 2), q_len=2, k_scale=0.5, v_scale=2.0, o_scale=2.0).case(),
)


def _fp8_scale_twice(batch: Batch) -> torch.Tensor:
    x = unpack(batch)
    a = batch.case.attention
    if a.kv_dtype == "fp8_e4m3":
        # The bug: fp8 K and V are dequantised with k_scale and v_scale although bmm1_scale and
        # bmm2_scale already carry them, so each scale is applied twice.
        x = dataclasses.replace(
            x,
            k_pages=x.k_pages.float() * a.k_scale,
            v_pages=x.v_pages.float() * a.v_scale,
        )
    return emit(batch, attend(x, a.page_size))


FP8_SCALE_TWICE = Mutant(
    name="mutant-fp8-scale-twice",
    bug_class="fp8 scale applied twice",
    bug="fp8 K/V dequantised with their scales on top of bmm1_scale and bmm2_scale",
    trigger="an fp8 KV cache with v_scale != 1, or k_scale != 1 where a row sees two terms",
    run=_fp8_scale_twice,
    minimal=Tiny(kv_dtype="fp8_e4m3", v_scale=2.0).case(),
    harmless=Tiny(prefix_lens=(3, 2), q_len=2, k_scale=0.5, v_scale=2.0).case(),
)

MUTANTS = (BMM2_IN_SOFTMAX, FP8_SCALE_TWICE)
