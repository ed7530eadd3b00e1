"""FlashInfer's prefill (context) kernels with a paged cache: two paths.

- ``fi-context-trtllm-gen``: ``flashinfer.prefill.trtllm_batch_context_with_kv_cache``
  (SM100/SM103 only; causal; an fp8 cache gets an fp8 query, as SGLang passes it).
- ``fi-context-fmha-v2``: ``flashinfer.prefill.trtllm_fmha_v2_prefill`` with
  ``input_layout="Q_PAGED_KV_HND"`` / ``"Q_PAGED_KV_NHD"`` (SM90 and SM12x). It reads KV lengths
  from ``cum_seq_lens_kv``, addresses the pool from one pointer (a ``[pages, 2, ...]`` tensor,
  or, where the release takes it, SGLang's ``(k, v)`` buffers with ``[B, 2, M]`` block
  offsets) and compiles one module per (layout, query dtype, fp8 output dtype).

The TRT-LLM gen context call pins ``backend="trtllm-gen"`` where the release takes
``backend=`` (it gained ``"cake"``); FMHAv2 has no backend to choose.

Both take the ragged query through ``cum_seq_lens_q`` and ``batch_size``, so under the SGLang
convention the query keeps its data-parallel padding rows (the kernel ignores them) and the
path returns the requests' rows.
"""

from __future__ import annotations

from typing import Any

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.contracts import check_context_args, contracts_enabled
from difftest.paths.flashinfer_api import takes_split_kv
from difftest.paths.flashinfer_env import (
    FlashInferEnv,
    base_reason,
    call_accepting,
    flashinfer_path,
    note_backend,
    trtllm_gen_available,
    trtllm_gen_limits,
    trtllm_gen_precision,
    workspace,
)
from difftest.paths.kernel_args import (
    context_kwargs,
    fmha_v2_kwargs,
    fmha_v2_layout,
    zeroed_workspace,
)
from difftest.paths.preparation import preparing
from difftest.paths.registry import Precision, register

FMHA_V2_HEAD_DIMS_SM90 = (32, 40, 48, 64, 80, 96, 104, 128, 160, 192, 256)
"""Head dims FlashInfer generates SM90 (warp-specialised) FMHAv2 kernels for."""
FMHA_V2_HEAD_DIMS_SM120 = (64, 128, 256)


def trtllm_gen_support(case: Case) -> str | None:
    return trtllm_gen_limits(case, "context")


def fmha_v2_available(env: FlashInferEnv) -> str | None:
    reason = base_reason(env)
    if reason is None and env.capability is not None:
        if env.capability != (9, 0) and env.capability[0] != 12:
            return f"FMHAv2 kernels are built for SM90 and SM12x only (this GPU is {env.arch})"
    return reason


def fmha_v2_support(case: Case, env: FlashInferEnv) -> str | None:
    """Limits of ``trtllm_fmha_v2_prefill`` with a paged cache (``prefill.py``,
    ``jit/attention/fmha_v2``, ``csrc/fmha_v2_run.cu``)."""
    a, b, pool = case.attention, case.batch, case.pool
    sm120 = env.capability is not None and env.capability[0] == 12
    if b.draft.kind == "tree":
        return "FMHAv2 paged prefill has no draft mask (causal or sliding window only)"
    if (
        case.convention == "sglang"
        and pool.kv_storage == "kv_split_nhd"
        and not (env.api.fmha_v2_split_kv)
    ):
        return (
            f"flashinfer {env.version}: trtllm_fmha_v2_prefill takes no (k, v) tuple and "
            "addresses the pool as one [pages, 2, ...] tensor, ignoring strides: SGLang's "
            "split K/V buffers cannot be passed"
        )
    if a.kv_dtype == "fp8_e4m3":
        if sm120:
            return "FMHAv2 has no fp8 (e4m3) kernels on SM120"
    elif a.kv_dtype != a.q_dtype:
        return f"FMHAv2 needs K/V in the query dtype (kv {a.kv_dtype}, q {a.q_dtype})"
    elif a.out_dtype != a.q_dtype:
        return f"FMHAv2 writes the query dtype: out_dtype {a.out_dtype} != q_dtype {a.q_dtype}"
    dims = FMHA_V2_HEAD_DIMS_SM120 if sm120 else FMHA_V2_HEAD_DIMS_SM90
    if a.head_dim not in dims:
        return f"FMHAv2 has no kernels for head_dim {a.head_dim} (built: {dims})"
    if a.page_size & (a.page_size - 1) or a.page_size < 16:
        return f"FMHAv2 page_size must be a power of two >= 16 (got {a.page_size})"
    return None


def fmha_v2_build_key(case: Case) -> tuple[object, ...]:
    """What one FMHAv2 JIT module is built for (``gen_fmha_v2_module``'s URI): the input
    layout the case is called with (:func:`~difftest.paths.kernel_args.fmha_v2_layout`) and
    the input and output dtypes; every head dim is in it."""
    a = case.attention
    return (fmha_v2_layout(case), a.q_dtype, a.kv_dtype, a.out_dtype)


def fmha_v2_precision(case: Case) -> Precision:
    """P in the query dtype (fp16 kernels also accumulate in fp16, which the precision model
    cannot express); with an fp8 cache the query is quantised to e4m3 and P is e4m3."""
    if case.attention.kv_dtype == "fp8_e4m3":
        return Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
    return Precision(p_dtype=case.attention.q_dtype)


def _check(kwargs: dict[str, Any], query: torch.Tensor, kv: Any, layout: str, first: bool) -> None:
    if not contracts_enabled():
        return
    check_context_args(
        query=query,
        kv_cache=kv,
        block_tables=kwargs["block_tables"],
        seq_lens=kwargs["seq_lens"],
        max_q_len=kwargs["max_q_len"],
        max_kv_len=kwargs["max_kv_len"],
        batch_size=kwargs["batch_size"],
        cum_seq_lens_q=kwargs["cum_seq_lens_q"],
        cum_seq_lens_kv=kwargs["cum_seq_lens_kv"],
        workspace_buffer=kwargs["workspace_buffer"],
        kv_layout=layout,
        sinks=kwargs["sinks"],
        out=kwargs["out"],
        window_left=kwargs["window_left"],
        workspace_first_use=first,
    )


def _check_trtllm_gen(kwargs: dict[str, Any], first: bool) -> None:
    _check(kwargs, kwargs["query"], kwargs["kv_cache"], kwargs["kv_layout"], first)


def _check_fmha_v2(kwargs: dict[str, Any], first: bool) -> None:
    query, paged = kwargs["qkv"]
    tables = kwargs["block_tables"]
    if isinstance(paged, tuple):  # (k, v) with [B, 2, M] offsets: row 0 holds the K pages
        if tables.dim() != 3 or tables.shape[1] != 2:
            raise ValueError(f"(k, v) form needs [B, 2, M] block offsets, got {tables.shape}")
        kwargs = {**kwargs, "block_tables": tables[:, 0]}
    _check(kwargs, query, paged, kwargs["input_layout"].removeprefix("Q_PAGED_KV_"), first)


def _rows(batch: Batch, out: torch.Tensor) -> torch.Tensor:
    """The requests' rows of an output that may carry padding rows."""
    return out[: batch.case.batch.num_query_rows]


def call_trtllm_context(batch: Batch, workspace: torch.Tensor) -> torch.Tensor:
    """``fi-context-trtllm-gen``'s kernel call as a standalone script makes it:
    ``trtllm_batch_context_with_kv_cache`` with the arguments of
    :func:`~difftest.paths.kernel_args.context_kwargs`, cut to the requests' rows. Needs torch
    and flashinfer only (``difftest export`` copies it)."""
    return launch_trtllm_context(batch, context_kwargs(batch, workspace))


def launch_trtllm_context(batch: Batch, kwargs: dict[str, Any]) -> torch.Tensor:
    """The library's call alone, with the backend pinned where the release can choose (it
    has "cake"), cut to the requests' rows."""
    import flashinfer.prefill

    fn = flashinfer.prefill.trtllm_batch_context_with_kv_cache
    kwargs["backend"] = "trtllm-gen"
    out = call_accepting(fn, kwargs, {"causal", "backend"})
    assert isinstance(out, torch.Tensor)
    return _rows(batch, out)


def fmha_v2_call_kwargs(batch: Batch, workspace: torch.Tensor) -> dict[str, Any]:
    """:func:`~difftest.paths.kernel_args.fmha_v2_kwargs` in the form the installed release
    takes (whether it splits the paged cache into K and V)."""
    import flashinfer.prefill

    return fmha_v2_kwargs(batch, workspace, split_kv=takes_split_kv(flashinfer.prefill))


def call_fmha_v2(batch: Batch, workspace: torch.Tensor) -> torch.Tensor:
    """``fi-context-fmha-v2``'s kernel call as a standalone script makes it:
    ``trtllm_fmha_v2_prefill`` with the arguments of :func:`fmha_v2_call_kwargs`, cut to the
    requests' rows. Needs torch and flashinfer only (``difftest export`` copies it)."""
    return launch_fmha_v2(batch, fmha_v2_call_kwargs(batch, workspace))


def launch_fmha_v2(batch: Batch, kwargs: dict[str, Any]) -> torch.Tensor:
    """The library's call alone, cut to the requests' rows."""
    import flashinfer.prefill

    out = call_accepting(flashinfer.prefill.trtllm_fmha_v2_prefill, kwargs, set())
    assert isinstance(out, torch.Tensor)
    return _rows(batch, out)


def run_trtllm_gen(batch: Batch) -> torch.Tensor:
    ws, first = workspace(batch.device, "context-trtllm-gen")
    with preparing(batch.device):  # difftest's work, not the kernel's
        kwargs = context_kwargs(batch, ws)
        _check_trtllm_gen(kwargs, first)
    out = launch_trtllm_context(batch, kwargs)
    note_backend("fi-context-trtllm-gen", "trtllm-gen")
    return out


def run_fmha_v2(batch: Batch) -> torch.Tensor:
    ws, first = workspace(batch.device, "context-fmha-v2")
    with preparing(batch.device):  # difftest's work, not the kernel's
        kwargs = fmha_v2_call_kwargs(batch, ws)
        _check_fmha_v2(kwargs, first)
    return launch_fmha_v2(batch, kwargs)


def standalone_trtllm_gen(batch: Batch) -> torch.Tensor:
    """:func:`run_trtllm_gen` in a standalone script: a new zeroed workspace, no checks."""
    return call_trtllm_context(batch, zeroed_workspace(batch.device))


def standalone_fmha_v2(batch: Batch) -> torch.Tensor:
    """:func:`run_fmha_v2` in a standalone script: a new zeroed workspace, no checks."""
    return call_fmha_v2(batch, zeroed_workspace(batch.device))


register(
    flashinfer_path(
        name="fi-context-trtllm-gen",
        run=run_trtllm_gen,
        standalone=standalone_trtllm_gen,
        available=trtllm_gen_available,
        limits=lambda case, env: trtllm_gen_support(case),
        side="prefill",
        precision=trtllm_gen_precision,
        description="trtllm_batch_context_with_kv_cache(max_q_len=L, batch_size, cum_seq_lens_*)",
        tags=("prefill", "trtllm-gen"),
        pinned_backend="trtllm-gen",
    )
)
register(
    flashinfer_path(
        name="fi-context-fmha-v2",
        run=run_fmha_v2,
        standalone=standalone_fmha_v2,
        available=fmha_v2_available,
        limits=fmha_v2_support,
        side="prefill",
        precision=fmha_v2_precision,
        description="trtllm_fmha_v2_prefill(input_layout='Q_PAGED_KV_HND'/'..._NHD')",
        tags=("prefill", "fmha-v2"),
        build_key=fmha_v2_build_key,
        build_cost_s=300.0,  # one module per layout and dtypes: 166-373 s cold (Runs 7-10)
    )
)
