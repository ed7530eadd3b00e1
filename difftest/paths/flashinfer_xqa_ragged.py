"""``fi-xqa-ragged``: XQA with ragged queries, through ``xqa_batch_decode_with_kv_cache``.

``trtllm_batch_decode_with_kv_cache(backend="xqa")`` refuses ``max_q_len``/``cum_seq_lens_q``
in every release (0.6.11 to 0.7.4), so SGLang's ragged verify cannot reach XQA through the
decode API. XQA itself takes ragged queries from 0.6.16: ``xqa_batch_decode_with_kv_cache``
with ``q_cu_seq_lens`` (int32 prefix sums of the requests' query rows), ``q_len_per_req`` the
largest count (> 1), the query packed ``[total, H_q, D]`` and the draft mask's rows packed by
the same offsets (row ``i`` of request ``b``: its draft token ``i``'s visibility over the
request's own draft tokens, ``csrc/xqa/mha.cu``). Uniform batches go the same way (prefix
sums ``0, L, 2L, ..``): the ragged kernel is a module of its own.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.flashinfer_decode import xqa_available, xqa_build_key, xqa_support
from difftest.paths.flashinfer_env import (
    FlashInferEnv,
    call_accepting,
    flashinfer_path,
    workspace,
)
from difftest.paths.kernel_args import (
    pack_draft_mask,
    paging,
    trtllm_kv,
    zeroed_workspace,
)
from difftest.paths.modes import PathModes, accepts
from difftest.paths.preparation import preparing
from difftest.paths.registry import Precision, register

NAME = "fi-xqa-ragged"


def ragged_mask(batch: Batch) -> torch.Tensor:
    """uint16 ``[R, 2 * ceil(L / 32)]``: the packed draft mask, request ``b``'s first ``L_b``
    rows (a row sees only earlier draft tokens, so its bits past ``L_b`` are 0)."""
    packed = pack_draft_mask(batch.draft_mask, 1)[0]  # [L, words]
    counts = batch.case.batch.new_tokens()
    return torch.cat([packed[:n] for n in counts]).contiguous()


def xqa_ragged_kwargs(batch: Batch, workspace_buffer: torch.Tensor) -> dict[str, Any]:
    """``xqa_batch_decode_with_kv_cache`` keyword arguments (the ragged form)."""
    kv, layout = trtllm_kv(batch)
    p = paging(batch)
    return {
        "query": batch.q,
        "kv_cache": kv,
        "workspace_buffer": workspace_buffer,
        "block_tables": p.block_tables,
        "seq_lens": p.seq_lens,
        "max_seq_len": p.max_seq_len,
        "bmm1_scale": batch.bmm1_scale,
        "bmm2_scale": batch.bmm2_scale,
        "window_left": batch.window_left,
        "out": batch.new_output(),
        "sinks": batch.sinks,
        "kv_layout": layout,
        "q_len_per_req": batch.q_len,
        "mask": ragged_mask(batch),
        "q_cu_seq_lens": batch.cu_seqlens_q(),
    }


def call_xqa_ragged(batch: Batch, workspace_buffer: torch.Tensor) -> torch.Tensor:
    """The kernel call (torch and flashinfer only: ``difftest export`` copies it)."""
    return launch_xqa_ragged(xqa_ragged_kwargs(batch, workspace_buffer))


def launch_xqa_ragged(kwargs: dict[str, Any]) -> torch.Tensor:
    """``xqa_batch_decode_with_kv_cache(**kwargs)``: the library's call alone."""
    import flashinfer.decode

    fn = flashinfer.decode.xqa_batch_decode_with_kv_cache
    out = call_accepting(fn, kwargs, set())
    assert isinstance(out, torch.Tensor)
    return out


def run(batch: Batch) -> torch.Tensor:
    ws, _ = workspace(batch.device, "decode-xqa-ragged")
    with preparing(batch.device):  # difftest's work, not the kernel's
        kwargs = xqa_ragged_kwargs(batch, ws)
    return launch_xqa_ragged(kwargs)


def standalone(batch: Batch) -> torch.Tensor:
    return call_xqa_ragged(batch, zeroed_workspace(batch.device))


def available(env: FlashInferEnv) -> str | None:
    reason = xqa_available(env)
    if reason is not None:
        return reason
    import flashinfer.decode

    fn = getattr(flashinfer.decode, "xqa_batch_decode_with_kv_cache", None)
    if fn is None or "q_cu_seq_lens" not in inspect.signature(fn).parameters:
        return f"flashinfer {env.version}: xqa_batch_decode_with_kv_cache has no q_cu_seq_lens"
    return None


def limits(case: Case, env: FlashInferEnv) -> str | None:
    if case.batch.q_len < 2:
        return "q_cu_seq_lens needs q_len_per_req (the largest L) > 1"
    return xqa_support(case)


def precision(case: Case) -> Precision:
    """The generic XQA kernel (ragged queries never take the Hopper fp8 one): P in the query
    dtype."""
    return Precision(p_dtype=case.attention.q_dtype)


register(
    dataclasses.replace(
        flashinfer_path(
            name=NAME,
            run=run,
            standalone=standalone,
            available=available,
            limits=limits,
            side="decode",
            precision=precision,
            description="xqa_batch_decode_with_kv_cache(q_cu_seq_lens, q_len_per_req=max L, mask)",
            tags=("decode", "xqa", "ragged"),
            build_key=lambda case: (*xqa_build_key(case), "ragged"),
            build_cost_s=20.0,  # 9-22 s cold (Run 10)
        ),
        modes=PathModes(ragged=accepts),  # skip-softmax: not a parameter here (exact attention)
    )
)
