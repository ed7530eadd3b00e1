"""A materialised batch: the tensors a kernel path receives for one
:class:`~difftest.model.case.Case`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from difftest.model.case import Case

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
}


@dataclass(frozen=True, eq=False, kw_only=True)
class Batch:
    """Tensors of one case on one device, laid out as a serving engine holds them.

    Shapes (``bs`` counts CUDA-graph padding requests, ``R = bs * L``):

    - ``q``: ``[R, H_q, D]``, the query rows of the requests, row ``b * L + i``; a view of the
      first ``R`` rows of ``q_padded`` (``[R + padding_rows, H_q, D]``).
    - ``kv_cache``: ``[num_pages, 2, H_kv, page_size, D]`` (HND), possibly a strided view of
      ``kv_storage`` (the tensor the pool really is); ``k_pages``/``v_pages`` are its halves.
    - ``block_tables``: int32 ``[bs, W]``; columns past a request's pages hold the case's fill.
    - ``seq_lens``: int32 ``[bs]``, prefix plus new tokens.
    - ``sinks``: float32 ``[H_q]`` or ``None``; ``draft_mask``: bool ``[L, L]`` (lower
      triangular for a chain draft).
    """

    case: Case
    device: torch.device
    q_padded: torch.Tensor
    kv_storage: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    sinks: torch.Tensor | None
    draft_mask: torch.Tensor

    @property
    def q(self) -> torch.Tensor:
        return self.q_padded[: self.case.batch.num_query_rows]

    @property
    def q_len(self) -> int:
        return self.case.batch.q_len

    @property
    def batch_size(self) -> int:
        return self.case.batch.num_requests

    @property
    def k_pages(self) -> torch.Tensor:
        return self.kv_cache[:, 0]

    @property
    def v_pages(self) -> torch.Tensor:
        return self.kv_cache[:, 1]

    @property
    def bmm1_scale(self) -> float:
        return self.case.attention.bmm1_scale

    @property
    def bmm2_scale(self) -> float:
        return self.case.attention.bmm2_scale

    @property
    def window_left(self) -> int:
        return self.case.attention.window_left

    @property
    def is_chain_draft(self) -> bool:
        return self.case.batch.draft.kind == "causal"

    @property
    def out_dtype(self) -> torch.dtype:
        return DTYPES[self.case.attention.out_dtype]

    def new_output(self) -> torch.Tensor:
        """A NaN-filled ``[R, H_q, D]`` output of the case's out dtype: rows a path never
        writes stay NaN and are reported as such."""
        a = self.case.attention
        shape = (self.case.batch.num_query_rows, a.num_qo_heads, a.head_dim)
        return torch.full(shape, float("nan"), dtype=self.out_dtype, device=self.device)

    def cu_seqlens_q(self) -> torch.Tensor:
        """int32 ``[bs + 1]``: ``0, L, 2L, ...``."""
        bs, L = self.batch_size, self.q_len
        return torch.arange(0, (bs + 1) * L, L, dtype=torch.int32, device=self.device)

    def cu_seqlens_kv(self) -> torch.Tensor:
        """int32 ``[bs + 1]``: prefix sums of ``seq_lens``."""
        zero = torch.zeros(1, dtype=torch.int32, device=self.device)
        return torch.cat([zero, torch.cumsum(self.seq_lens, 0, dtype=torch.int32)])
