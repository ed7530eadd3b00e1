"""The noise floors as the framework computes them, from the torch form and from the fused
kernels, for the tests that hold the two together (``tests/unit/test_oracle_fused.py`` under
Triton's interpreter, ``tests/gpu/test_oracle_fused_gpu.py`` on CUDA)."""

from __future__ import annotations

from typing import Any

import torch

from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.oracle import fused
from difftest.oracle.batched import Rounding, batched_paged_attention

FLOOR_RATIO = 1.5
"""How far apart a request's two floors may be, as a factor. Two float32 computations that
add in other orders round some probabilities to neighbouring values (a term within an ulp of
a rounding boundary), so their floors differ a little: within 1.16x on the first 80 stored
cases under the interpreter, mostly not at all once rounded to the output dtype. A rounding
left out (fp8 probabilities) or a wrong mask moves a floor by far more."""


def launch(batch: Batch) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional arguments of the oracle's attention functions for ``batch`` but the
    roundings (cache, table, lengths), and their keyword arguments."""
    args = (
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.new_tokens() if batch.is_ragged else batch.q_len,
    )
    kwargs = {
        "bmm1_scale": batch.bmm1_scale,
        "bmm2_scale": batch.bmm2_scale,
        "window_left": batch.window_left,
        "sinks": batch.sinks,
        "draft_mask": None if batch.is_chain_draft else batch.draft_mask,
    }
    return args, kwargs


def outputs(batch: Batch, fused_form: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The float64 oracle (torch form) and the float32 roundings of
    :func:`difftest.oracle.fused.floor_roundings`, from the kernels when ``fused_form``
    (``use_fused=True``), else from the torch form."""
    roundings = [Rounding(batch.q), *fused.floor_roundings(batch.q)]
    args, kwargs = launch(batch)
    ref = batched_paged_attention(*args, roundings[:1], **kwargs)[0]
    if fused_form:
        return ref, fused.batched_attention(*args, roundings[1:], use_fused=True, **kwargs)
    return ref, batched_paged_attention(*args, roundings[1:], **kwargs)


def floors(batch: Batch, ref: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """``[bs]`` the floor the framework takes from ``low``: rounded to the output dtype,
    each request's largest distance from ``ref``."""
    return compare.floor_of(low.to(batch.out_dtype).double(), ref, batch)


def worst_ratio(batch: Batch) -> float:
    """The largest factor between a request's floor from the kernels and from the torch
    form, over every rounding (1 where both are 0; inf where one only is 0 or not finite)."""
    ref, want = outputs(batch, fused_form=False)
    _, got = outputs(batch, fused_form=True)
    worst = 1.0
    for g, w in zip(got, want, strict=True):
        a, b = floors(batch, ref, g), floors(batch, ref, w)
        same = a == b  # both 0, or both inf
        ratio = torch.maximum(a / b, b / a)
        worst = max(worst, float(torch.where(same, 1.0, ratio.nan_to_num(nan=float("inf"))).max()))
    return worst
