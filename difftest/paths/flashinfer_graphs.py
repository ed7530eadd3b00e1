"""CUDA-graph captures of FlashInfer calls, the way SGLang captures them.

Each capture gets the batch of a graph's static buffers (:mod:`difftest.execution.graph_replay`)
and returns how to replay it. The call is the path's own (the same kwargs builders), run once
outside the graph (modules load, lazy buffers are allocated), then captured with
``torch.cuda.graph``. Host arguments (scales, ``max_seq_len``, the batch size) are fixed by the
capture, as in an engine. The planned wrappers are built with ``use_cuda_graph=True`` over
their own static index buffers and are planned again before each replay, as SGLang's
``init_forward_metadata_replay_cuda_graph`` does: planning is host work and copies the new
batch's indices into those buffers.

FlashInfer is imported lazily, inside the captures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.flashinfer_api import decode_qlen_arg
from difftest.paths.flashinfer_env import call_accepting
from difftest.paths.kernel_args import (
    decode_kwargs,
    decode_plan_kwargs,
    prefill_plan_kwargs,
    skip_softmax_kwargs,
    wrapper_kv,
    zeroed_workspace,
)
from difftest.paths.modes import CaptureFn, Replay


def cuda_graph(device: torch.device, launch: Callable[[], object], out: torch.Tensor) -> Replay:
    """Capture ``launch`` (which writes ``out``) in a CUDA graph, after one run outside it;
    the replay NaN-fills ``out`` first, so rows the graph never writes stay NaN."""
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()

    def replay(batch: Batch) -> torch.Tensor:
        out.fill_(float("nan"))
        graph.replay()
        return out

    return replay


def capture_trtllm_decode(backend: Literal["xqa", "trtllm-gen"]) -> CaptureFn:
    """``trtllm_batch_decode_with_kv_cache`` captured over the static buffers (SGLang's
    decode and target-verify graphs), on a workspace of its own."""

    def capture(batch: Batch) -> Replay:
        import flashinfer.decode

        kwargs = decode_kwargs(batch, zeroed_workspace(batch.device), backend)
        fn = flashinfer.decode.trtllm_batch_decode_with_kv_cache
        query = kwargs["query"]

        def launch() -> object:
            if query is not batch.q:  # a converted copy (fp8): refreshed inside the graph
                query.copy_(batch.q)
            return call_accepting(fn, kwargs, set())

        return cuda_graph(batch.device, launch, kwargs["out"])

    return capture


def _v_scale(batch: Batch) -> float | None:
    return None if batch.bmm2_scale == 1.0 else batch.bmm2_scale


def _index_buffers(batch: Batch) -> dict[str, torch.Tensor]:
    """Static CSR buffers for a batch of ``bs`` requests over a ``W``-column table."""
    bs, width = batch.batch_size, batch.block_tables.shape[1]
    dev = batch.device

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int32, device=dev)

    return {
        "indptr": zeros(bs + 1),
        "kv_indptr": zeros(bs + 1),
        "indices": zeros(bs * width),
        "last_page_len": zeros(bs),
    }


def capture_prefill(backend: str) -> CaptureFn:
    """``BatchPrefillWithPagedKVCacheWrapper(use_cuda_graph=True)`` (chain drafts without
    sinks: see :func:`prefill_capture_limits`)."""

    def capture(batch: Batch) -> Replay:
        import flashinfer

        kv, layout = wrapper_kv(batch)
        bufs = _index_buffers(batch)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            zeroed_workspace(batch.device),
            layout,
            use_cuda_graph=True,
            qo_indptr_buf=bufs["indptr"],
            paged_kv_indptr_buf=bufs["kv_indptr"],
            paged_kv_indices_buf=bufs["indices"],
            paged_kv_last_page_len_buf=bufs["last_page_len"],
            backend=backend,
        )
        wrapper.plan(**prefill_plan_kwargs(batch))
        out = batch.new_output()
        run: dict[str, Any] = {"out": out, "v_scale": _v_scale(batch), **skip_softmax_kwargs(batch)}
        graph = cuda_graph(batch.device, lambda: wrapper.run(batch.q, kv, **run), out)

        def replay(loaded: Batch) -> torch.Tensor:
            wrapper.plan(**prefill_plan_kwargs(loaded))
            return graph(loaded)

        return replay

    return capture


def prefill_capture_limits(case: Case, device: torch.device) -> str | None:
    if case.attention.sinks:
        return "the fa2/fa3 capture builds the plain prefill wrapper: no sinks"
    if case.batch.draft.kind == "tree":
        return "the fa2/fa3 capture has no custom-mask buffers: no tree drafts"
    return None


def capture_decode_wrapper(batch: Batch) -> Replay:
    """``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True, use_tensor_cores=True)``,
    ``q_len_per_req`` where this release takes it."""
    import flashinfer

    kv, layout = wrapper_kv(batch)
    bufs = _index_buffers(batch)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        zeroed_workspace(batch.device),
        layout,
        use_cuda_graph=True,
        use_tensor_cores=True,
        paged_kv_indptr_buffer=bufs["kv_indptr"],
        paged_kv_indices_buffer=bufs["indices"],
        paged_kv_last_page_len_buffer=bufs["last_page_len"],
        backend="fa2",
    )
    where = decode_qlen_arg(flashinfer.BatchDecodeWithPagedKVCacheWrapper)
    out = batch.new_output()
    run: dict[str, Any] = {"out": out, "v_scale": _v_scale(batch), **skip_softmax_kwargs(batch)}
    if where == "run" and batch.q_len > 1:
        run["q_len_per_req"] = batch.q_len

    def plan(b: Batch) -> None:
        kwargs = decode_plan_kwargs(b)
        if where == "plan":
            kwargs["q_len_per_req"] = b.q_len
        wrapper.plan(**kwargs)

    plan(batch)
    graph = cuda_graph(batch.device, lambda: wrapper.run(batch.q, kv, **run), out)

    def replay(loaded: Batch) -> torch.Tensor:
        plan(loaded)
        return graph(loaded)

    return replay
