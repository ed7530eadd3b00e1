"""A Triton kernel that applies :func:`difftest.oracle.fused_kernels.rounded` to a float32
array, for ``test_oracle_fused.py`` (imported only where Triton is, under its interpreter)."""

from __future__ import annotations

import triton
import triton.language as tl

from difftest.oracle import fused_kernels


@triton.jit
def rounded_all(
    x_ptr, y_ptr, n, p_mbits, p_emin, p_max_bits, p_over_nan, BLOCK: tl.constexpr
):  # fmt: skip
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    y = fused_kernels.rounded(x, p_mbits, p_emin, p_max_bits, p_over_nan)
    tl.store(y_ptr + i, y, mask=i < n)
