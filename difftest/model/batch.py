"""A materialised batch: the tensors a kernel path receives for one
:class:`~difftest.model.case.Case`."""

from __future__ import annotations

from collections.abc import Callable
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

    Shapes (``bs`` counts CUDA-graph padding requests, ``R = bs * L``, or with ragged requests
    the sum of their new tokens ``L_b``):

    - ``q``: ``[R, H_q, D]``, the query rows of the requests, request by request (row
      ``b * L + i`` when uniform, ``cu_seqlens_q[b] + i`` when ragged); a view of the first
      ``R`` rows of ``q_padded`` (``[R + padding_rows, H_q, D]``).
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
        """``L``: the new tokens of every request, or the largest count when ragged."""
        return self.case.batch.q_len

    @property
    def is_ragged(self) -> bool:
        return self.case.batch.is_ragged

    def _shared(self, name: str, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``build()``, built once per batch: the row layouts below are read by every path, the
        oracle and each judgement of a case, and depend on the case alone. The tensor returned
        is shared: read it, never write it."""
        memo: dict[str, torch.Tensor] = self.__dict__.setdefault("_memo", {})
        if name not in memo:
            memo[name] = build()
        return memo[name]

    def knowing(self, **layouts: torch.Tensor) -> Batch:
        """This batch with row layouts already built (``new_tokens=``, ``row_requests=``: what
        those methods would build, on this batch's device), so that they are not built again
        here. Returns ``self``."""
        unknown = set(layouts) - {"new_tokens", "row_requests"}
        if unknown:
            raise ValueError(f"not a row layout of a batch: {sorted(unknown)}")
        self.__dict__.setdefault("_memo", {}).update(layouts)
        return self

    def new_tokens(self) -> torch.Tensor:
        """int64 ``[bs]``: each request's new tokens (query rows), ``L`` when uniform
        (shared, see :meth:`_shared`)."""
        return self._shared(
            "new_tokens",
            lambda: torch.tensor(
                self.case.batch.new_tokens(), dtype=torch.int64, device=self.device
            ),
        )

    def frame_rows(self) -> torch.Tensor:
        """int64 ``[R]``: where each query row goes in a *uniform frame* of ``L`` rows per
        request (``[bs * L]``). A ragged request's rows take its last ``L_b`` slots, so slot
        ``l`` of every request is at position ``T_b - L + l``, as when uniform (identity then;
        shared, see :meth:`_shared`)."""
        return self._shared("frame_rows", self._frame_rows)

    def _frame_rows(self) -> torch.Tensor:
        counts = self.new_tokens()
        req = self.row_requests()
        first_row = torch.cumsum(counts, 0) - counts
        within = torch.arange(req.shape[0], device=self.device) - first_row[req]
        return req * self.q_len + (self.q_len - counts)[req] + within

    def frame_queries(self) -> torch.Tensor:
        """float32 ``[bs * L, H_q, D]``: the query rows in the uniform frame
        (:meth:`frame_rows`), zero where a ragged request has no query."""
        if not self.is_ragged:
            return self.q.float()
        a = self.case.attention
        shape = (self.batch_size * self.q_len, a.num_qo_heads, a.head_dim)
        frame = torch.zeros(shape, dtype=torch.float32, device=self.device)
        frame[self.frame_rows()] = self.q.float()
        return frame

    def output_from_frame(self, out: torch.Tensor) -> torch.Tensor:
        """``[bs, L, H_q, D]`` in the uniform frame -> a new output ``[R, H_q, D]`` of the case's
        output dtype (:meth:`new_output` filled with the requests' rows)."""
        a = self.case.attention
        rows = out.reshape(-1, a.num_qo_heads, a.head_dim)
        result = self.new_output()
        result.copy_(rows[self.frame_rows()] if self.is_ragged else rows)
        return result

    def frame_draft_mask(self) -> torch.Tensor:
        """bool ``[bs, L, L]``: the draft-block mask of each request in the uniform frame
        (:meth:`frame_rows`). Request ``b``'s draft tokens ``0..L_b-1`` are at slots
        ``s = L - L_b`` on, so cell ``(l, m)`` is ``draft_mask[l - s, m - s]``; columns before
        ``s`` are the request's prefix (visible), rows before ``s`` hold no query."""
        L = self.q_len
        s = (L - self.new_tokens()).view(-1, 1, 1)
        slot = torch.arange(L, device=self.device)
        row, col = slot.view(1, -1, 1), slot.view(1, 1, -1)
        moved = self.draft_mask[(row - s).clamp(min=0), (col - s).clamp(min=0)]
        return (col < s) | (row < s) | moved

    def row_requests(self) -> torch.Tensor:
        """int64 ``[R]``: the request each query row belongs to (shared, see :meth:`_shared`)."""
        return self._shared("row_requests", self._row_requests)

    def _row_requests(self) -> torch.Tensor:
        reqs = torch.arange(self.batch_size, device=self.device)
        return torch.repeat_interleave(reqs, self.new_tokens())

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
        """int32 ``[bs + 1]``: ``0, L, 2L, ...``; ragged: prefix sums of the new tokens."""
        bs, L = self.batch_size, self.q_len
        if not self.is_ragged:
            return torch.arange(0, (bs + 1) * L, L, dtype=torch.int32, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        return torch.cat([zero, torch.cumsum(self.new_tokens(), 0)]).to(torch.int32)

    def cu_seqlens_kv(self) -> torch.Tensor:
        """int32 ``[bs + 1]``: prefix sums of ``seq_lens``."""
        zero = torch.zeros(1, dtype=torch.int32, device=self.device)
        return torch.cat([zero, torch.cumsum(self.seq_lens, 0, dtype=torch.int32)])
