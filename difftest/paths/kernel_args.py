"""Kernel arguments: pure functions from a :class:`~difftest.model.batch.Batch` to FlashInfer
kwargs.

Each builder returns the keyword arguments one kernel receives for one batch, under the case's
calling convention (``docs/semantics.md`` §3):

- ``sglang``: what SGLang's TRT-LLM MHA backend passes. ``seq_lens = P_b + L``; the page table
  as the batch holds it (the case's width and fill, e.g. ``ceil(context_len / page_size)``
  columns with garbage past the used ones); ``max_seq_len`` / ``max_kv_len = context_len``;
  with SGLang's per-token K/V buffers (``kv_split_nhd``) the TRT-LLM kernels get the ``(K, V)``
  tuple of permuted HND views (degenerate strides rewritten for one KV head), the wrappers get
  the plain NHD page views; the prefill kernels get the query *with* data-parallel padding rows.
- ``plain``: exact tensors: a contiguous HND cache, the page table cut to the width the longest
  request needs, ``max_seq_len`` = the longest ``T_b``.

Nothing here imports FlashInfer or launches a kernel: builders return tensors and plain values,
so they are unit-tested on a CPU. The workspace is passed in (zeroed, 128 MiB or more:
:func:`zeroed_workspace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case

KV = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
Layout = Literal["HND", "NHD"]

WORKSPACE_BYTES = 384 << 20
"""Workspace size the adapters allocate, zeroed: SGLang's default FlashInfer workspace
(``SGLANG_FLASHINFER_WORKSPACE_SIZE`` in ``python/sglang/srt/environ.py``, 384 MiB). The fa2
planner reserves its split-KV scratch from it (see ``docs/validation.md``)."""


def zeroed_workspace(device: torch.device) -> torch.Tensor:
    """A new zeroed workspace of :data:`WORKSPACE_BYTES` on ``device`` (XQA's semaphores at its
    start must be zero on first use). A normal tensor even when asked for inside
    :func:`torch.inference_mode` (where cases are evaluated): the buffer outlives the case,
    and a caller outside inference mode may still change it in place."""
    with torch.inference_mode(False):
        return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


@dataclass(frozen=True, slots=True)
class Paging:
    """Page table, lengths and the length bound one convention passes."""

    block_tables: torch.Tensor
    """int32 ``[bs, W]``."""
    seq_lens: torch.Tensor
    """int32 ``[bs]``: ``P_b + L``."""
    max_seq_len: int
    """``context_len`` (sglang) or the longest ``T_b`` (plain)."""


def exact_width(batch: Batch) -> int:
    """Columns the longest request needs: ``ceil(max T_b / page_size)``."""
    return max(batch.case.pages_per_request())


def max_seq_len(case: Case) -> int:
    """The ``max_seq_len`` argument of ``case``'s convention: the context length (SGLang) or
    the longest ``T_b`` (plain)."""
    return case.context_len() if case.convention == "sglang" else case.max_seq_len_used()


def paging(batch: Batch) -> Paging:
    """The page table, ``seq_lens`` and ``max_seq_len`` of the batch's convention."""
    table = batch.block_tables  # SGLang: its whole, wider table
    if batch.case.convention == "plain":
        table = table[:, : exact_width(batch)].contiguous()
    return Paging(table, batch.seq_lens, max_seq_len(batch.case))


def canonicalize_stride(t: torch.Tensor) -> torch.Tensor:
    """Rewrite a size-1 dim's degenerate stride (equal to the next dim's) as SGLang does.

    With one KV head the HND view ``[pages, 1, page_size, D]`` has stride ``[., D, D, 1]``;
    TMA descriptors reject it, so the size-1 dim gets the canonical stride.
    """
    sizes, strides = t.size(), t.stride()
    if not any(sizes[i] == 1 and strides[i] == strides[i + 1] for i in range(t.dim() - 1)):
        return t
    new = [1] * t.dim()
    for i in range(t.dim() - 2, -1, -1):
        new[i] = new[i + 1] * sizes[i + 1]
    new[0] = strides[0]  # the page stride is the pool's, not the canonical one
    return t.as_strided(sizes, new)


def _split_views(batch: Batch, permute: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's K and V buffers ``[slots, H_kv, D]`` seen as pages (HND if ``permute``)."""
    a = batch.case.attention
    out = []
    for buf in batch.kv_storage.unbind(0):
        pages = buf.view(-1, a.page_size, a.num_kv_heads, a.head_dim)
        if permute:
            pages = canonicalize_stride(pages.permute(0, 2, 1, 3))
        out.append(pages)
    return out[0], out[1]


def trtllm_kv(batch: Batch) -> tuple[KV, Layout]:
    """``(kv_cache, kv_layout)`` for the TRT-LLM kernels (decode, context)."""
    case = batch.case
    if case.convention == "plain":
        return batch.kv_cache.contiguous(), "HND"
    storage = case.pool.kv_storage
    if storage == "kv_split_nhd":
        return _split_views(batch, permute=True), "HND"
    return batch.kv_storage, "HND" if storage == "hnd" else "NHD"


def wrapper_kv(batch: Batch) -> tuple[KV, Layout]:
    """``(paged_kv_cache, kv_layout)`` for FlashInfer's wrappers (SGLang's FlashInfer backend
    passes its per-token buffers as NHD pages)."""
    case = batch.case
    if case.convention == "plain":
        return batch.kv_cache.contiguous(), "HND"
    storage = case.pool.kv_storage
    if storage == "kv_split_nhd":
        return _split_views(batch, permute=False), "NHD"
    return batch.kv_storage, "HND" if storage == "hnd" else "NHD"


def pack_draft_mask(mask: torch.Tensor, batch_size: int) -> torch.Tensor:
    """XQA's draft mask: uint16 ``[bs, L, 2 * ceil(L / 32)]`` from a bool ``[L, L]``.

    Row ``i`` is ``ceil(L / 32)`` little-endian 32-bit words; bit ``j`` says row ``i`` may see
    draft token ``j``. Every request gets the same mask (the draft shape is uniform).
    """
    L = mask.shape[0]
    words = -(-L // 32)
    padded = torch.zeros(L, words * 32, dtype=torch.int64, device=mask.device)
    padded[:, :L] = mask.to(torch.int64)
    weights = torch.bitwise_left_shift(
        torch.ones(32, dtype=torch.int64, device=mask.device),
        torch.arange(32, dtype=torch.int64, device=mask.device),
    )
    packed = (padded.view(L, words, 32) * weights).sum(-1)  # [L, words], each < 2**32
    signed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    halves = signed.contiguous().view(torch.uint16)  # little-endian: low half first
    return halves.unsqueeze(0).expand(batch_size, L, 2 * words).contiguous()


def _query(batch: Batch, *, padded: bool, fp8: bool) -> torch.Tensor:
    q = batch.q_padded if padded else batch.q
    return q.to(torch.float8_e4m3fn) if fp8 else q


def _fp8_kv(batch: Batch) -> bool:
    return batch.case.attention.kv_dtype == "fp8_e4m3"


def decode_kwargs(
    batch: Batch, workspace: torch.Tensor, backend: Literal["xqa", "trtllm-gen", "cake"]
) -> dict[str, Any]:
    """``trtllm_batch_decode_with_kv_cache`` keyword arguments.

    The decode kernel infers ``bs = rows // L``, so it gets the requests' rows only. XQA gets
    the packed draft mask (it requires one for ``L > 1``); TRT-LLM gen is always causal and gets
    an fp8 query for an fp8 cache (as SGLang quantises it).
    """
    kv, layout = trtllm_kv(batch)
    p = paging(batch)
    fp8_q = backend == "trtllm-gen" and _fp8_kv(batch)
    kwargs: dict[str, Any] = {
        "query": _query(batch, padded=False, fp8=fp8_q),
        "kv_cache": kv,
        "workspace_buffer": workspace,
        "block_tables": p.block_tables,
        "seq_lens": p.seq_lens,
        "max_seq_len": p.max_seq_len,
        "bmm1_scale": batch.bmm1_scale,
        "bmm2_scale": batch.bmm2_scale,
        "window_left": batch.window_left,
        "out": batch.new_output(),
        "out_dtype": batch.out_dtype,
        "sinks": batch.sinks,
        "kv_layout": layout,
        "backend": backend,
        "q_len_per_req": batch.q_len,
    }
    if backend == "xqa" and batch.q_len > 1:
        kwargs["mask"] = xqa_mask(batch)
    if batch.is_ragged:  # SGLang's ragged verify: the decode API's ragged form
        kwargs["q_len_per_req"] = None
        kwargs["max_q_len"] = batch.q_len
        kwargs["cum_seq_lens_q"] = batch.cu_seqlens_q()
    kwargs.update(skip_softmax_kwargs(batch))
    return kwargs


def skip_softmax_kwargs(batch: Batch) -> dict[str, Any]:
    """``skip_softmax_threshold_scale_factor`` when the case sets it (else nothing: the call
    is the one it always was)."""
    factor = batch.case.attention.skip_softmax_threshold_scale_factor
    return {} if factor is None else {"skip_softmax_threshold_scale_factor": factor}


def xqa_mask(batch: Batch) -> torch.Tensor:
    """The XQA draft mask the convention passes: sized by ``L`` (the case's draft mask), or,
    under SGLang with a longer speculative draft length ``D`` (``spec_draft_len``), SGLang's
    buffer ``[bs, D, ((D + 31) // 32) * 2]`` holding the chain (causal) mask of ``D`` tokens,
    whatever the batch's ``L``. What XQA then reads for each request is the GPU run's
    question (its kernel offsets request ``b``'s rows by ``b * L``)."""
    length = batch.case.batch.spec_draft_len
    if batch.case.convention != "sglang" or length is None:
        return pack_draft_mask(batch.draft_mask, batch.batch_size)
    chain = torch.ones(length, length, dtype=torch.bool, device=batch.device).tril()
    return pack_draft_mask(chain, batch.batch_size)


def context_kwargs(batch: Batch, workspace: torch.Tensor) -> dict[str, Any]:
    """``trtllm_batch_context_with_kv_cache`` keyword arguments (ragged query via
    ``cum_seq_lens_q``; under ``sglang`` the query keeps its data-parallel padding rows)."""
    kv, layout = trtllm_kv(batch)
    common = _ragged_context(batch, workspace)
    return {
        "query": common.pop("query"),
        "kv_cache": kv,
        **common,
        "kv_layout": layout,
        "causal": True,
    }


def _ragged_context(batch: Batch, workspace: torch.Tensor) -> dict[str, Any]:
    """What both TRT-LLM context kernels take alike: the query (under ``sglang`` with its
    data-parallel padding rows), a NaN-filled output, the paging, the ragged ``cum_seq_lens``,
    the scales, the window and the sinks."""
    p = paging(batch)
    query = _query(batch, padded=batch.case.convention == "sglang", fp8=_fp8_kv(batch))
    return {
        "query": query,
        "workspace_buffer": workspace,
        "block_tables": p.block_tables,
        "seq_lens": p.seq_lens,
        "max_q_len": batch.q_len,
        "max_kv_len": p.max_seq_len,
        "bmm1_scale": batch.bmm1_scale,
        "bmm2_scale": batch.bmm2_scale,
        "batch_size": batch.batch_size,
        "cum_seq_lens_q": batch.cu_seqlens_q(),
        "cum_seq_lens_kv": batch.cu_seqlens_kv(),
        "window_left": batch.window_left,
        "out": torch.full_like(query, float("nan"), dtype=batch.out_dtype),
        "out_dtype": batch.out_dtype,
        "sinks": batch.sinks,
        **skip_softmax_kwargs(batch),
    }


def fmha_v2_layout(case: Case) -> str:
    """The KV layout FMHAv2 is called with: the plain convention passes the contiguous HND
    cache; SGLang's passes the pool as stored (HND or NHD)."""
    return "HND" if case.convention == "plain" or case.pool.kv_storage == "hnd" else "NHD"


def split_block_offsets(batch: Batch, k_pages: torch.Tensor, v_pages: torch.Tensor) -> torch.Tensor:
    """FMHAv2's ``[bs, 2, W]`` block offsets for a ``(k_cache, v_cache)`` pair: row 0 the K
    page of each column, row 1 its V page, both counted in pages from ``k_cache``'s start
    (V lies ``delta`` pages after K in one allocation: ``page + delta``)."""
    page = k_pages[0].numel()
    gap = v_pages.storage_offset() - k_pages.storage_offset()
    if v_pages.untyped_storage().data_ptr() != k_pages.untyped_storage().data_ptr():
        raise ValueError("FMHAv2's (k, v) form needs K and V in one allocation")
    if gap <= 0 or gap % page:
        raise ValueError(f"V starts {gap} elements after K: not a whole number of pages")
    table = paging(batch).block_tables
    return torch.stack([table, table + gap // page], dim=1).contiguous()


def fmha_v2_kwargs(
    batch: Batch, workspace: torch.Tensor, *, split_kv: bool = False
) -> dict[str, Any]:
    """``trtllm_fmha_v2_prefill`` keyword arguments with a paged cache.

    FMHAv2 addresses the pool from one pointer and ignores strides. A ``[pages, 2, ...]``
    tensor (HND or NHD) goes with ``[bs, W]`` tables (K of page ``p`` at ``2p``, V at
    ``2p + 1``). SGLang's split K/V buffers go, where the release takes it (``split_kv``:
    :func:`~difftest.paths.flashinfer_api.takes_split_kv`), as the ``(k_cache, v_cache)``
    tuple of their contiguous NHD page views with ``[bs, 2, W]`` block offsets
    (:func:`split_block_offsets`); elsewhere they cannot be expressed (a
    :class:`ValueError`). The window is requested with ``mask_mode="sliding_window"`` (with
    ``"causal"`` FMHAv2 only honours ``0 < window_left < max_kv_len``).
    """
    case = batch.case
    tables: torch.Tensor | None = None
    paged: KV
    if case.convention == "plain":
        paged = batch.kv_cache.contiguous()
    elif case.pool.kv_storage == "kv_split_nhd":
        if not split_kv:
            raise ValueError(
                "this FMHAv2 takes no (k, v) tuple: it cannot address split K/V buffers "
                "(kv_storage=kv_split_nhd)"
            )
        k_pages, v_pages = _split_views(batch, permute=False)
        paged = (k_pages, v_pages)
        tables = split_block_offsets(batch, k_pages, v_pages)
    else:
        paged = batch.kv_storage
    layout = fmha_v2_layout(case)
    common = _ragged_context(batch, workspace)
    if tables is not None:
        common["block_tables"] = tables
    return {
        "qkv": (common.pop("query"), paged),
        "input_layout": f"Q_PAGED_KV_{layout}",
        **common,
        "mask_mode": "sliding_window" if batch.window_left >= 0 else "causal",
    }


def page_indices(batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR form of the used page-table columns: ``(indptr, indices, last_page_len)``, int32.

    ``indptr`` ``[bs + 1]`` counts ``ceil(T_b / page_size)`` pages per request, ``indices``
    lists them request by request, ``last_page_len`` is in ``1..page_size``.
    """
    ps = batch.case.attention.page_size
    seq = batch.seq_lens.to(torch.int64)
    pages = (seq + ps - 1) // ps
    cols = torch.arange(batch.block_tables.shape[1], device=seq.device).view(1, -1)
    indices = batch.block_tables[cols < pages.view(-1, 1)]  # row-major: request by request
    zero = torch.zeros(1, dtype=torch.int64, device=seq.device)
    indptr = torch.cat([zero, torch.cumsum(pages, 0)])
    last = seq - (pages - 1) * ps
    return indptr.to(torch.int32), indices.to(torch.int32), last.to(torch.int32)


def custom_mask(batch: Batch) -> torch.Tensor:
    """Flattened bool mask for a tree draft: per request ``[L_b, T_b]`` (prefix visible, the
    draft block as the case's mask, its top-left ``L_b x L_b`` for a ragged request),
    concatenated request by request."""
    parts = []
    for t, n in zip(batch.seq_lens.tolist(), batch.case.batch.new_tokens(), strict=True):
        rows = torch.ones(n, t, dtype=torch.bool, device=batch.device)
        rows[:, t - n :] = batch.draft_mask[:n, :n]
        parts.append(rows.reshape(-1))
    return torch.cat(parts)


def prefill_plan_kwargs(batch: Batch) -> dict[str, Any]:
    """``BatchPrefillWithPagedKVCacheWrapper.plan`` keyword arguments (causal, window at plan,
    ``sm_scale = bmm1_scale``; a tree draft as ``custom_mask``)."""
    a = batch.case.attention
    indptr, indices, last = page_indices(batch)
    kwargs: dict[str, Any] = {
        "qo_indptr": batch.cu_seqlens_q(),
        "paged_kv_indptr": indptr,
        "paged_kv_indices": indices,
        "paged_kv_last_page_len": last,
        "num_qo_heads": a.num_qo_heads,
        "num_kv_heads": a.num_kv_heads,
        "head_dim_qk": a.head_dim,
        "page_size": a.page_size,
        "causal": True,
        "window_left": batch.window_left,
        "sm_scale": batch.bmm1_scale,
        "q_data_type": batch.q.dtype,
        "kv_data_type": batch.kv_cache.dtype,
        "o_data_type": batch.out_dtype,
    }
    if not batch.is_chain_draft:
        kwargs["custom_mask"] = custom_mask(batch)
    return kwargs


def decode_plan_kwargs(batch: Batch) -> dict[str, Any]:
    """``BatchDecodeWithPagedKVCacheWrapper.plan`` keyword arguments (``q_len_per_req`` is
    added by the adapter where this release takes it)."""
    a = batch.case.attention
    indptr, indices, last = page_indices(batch)
    return {
        "indptr": indptr,
        "indices": indices,
        "last_page_len": last,
        "num_qo_heads": a.num_qo_heads,
        "num_kv_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "page_size": a.page_size,
        "window_left": batch.window_left,
        "sm_scale": batch.bmm1_scale,
        "q_data_type": batch.q.dtype,
        "kv_data_type": batch.kv_cache.dtype,
        "o_data_type": batch.out_dtype,
    }
