"""FlashInfer's decode kernel ``trtllm_batch_decode_with_kv_cache(q_len_per_req=L)``: three paths.

- ``fi-decode-xqa`` (``backend="xqa"``, SM90/SM100/SM120): the draft block's visibility comes from
  the packed uint16 mask (chain draft: lower triangular; tree draft: the case's mask).
- ``fi-decode-trtllm-gen`` (``backend="trtllm-gen"``, SM100/SM103 only): always causal, so tree
  drafts are unsupported; an fp8 cache gets an fp8 query, as SGLang passes it.
- ``fi-decode-cake`` (``backend="cake"``, releases that have it, SM100/SM103 only): the
  explicit-only Cake FMHA backend behind the same API; causal (it ignores ``mask``).

Each path pins its backend (``"auto"`` would pick XQA off SM10x and TRT-LLM gen on it). The
API reports nothing back; the function dispatches on the string, so the pin is what ran.

FlashInfer is imported lazily, inside :func:`launch_trtllm_decode`, the kernel call the paths
(and the scripts of ``difftest export``) share (see :mod:`difftest.paths.flashinfer_env`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.contracts import check_decode_args, contracts_enabled
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
from difftest.paths.kernel_args import decode_kwargs, zeroed_workspace
from difftest.paths.preparation import preparing
from difftest.paths.registry import Precision, register


def uses_sm90_fp8_xqa(case: Case, major: int) -> bool:
    """Whether XQA picks its Hopper fp8 kernel (``mha_sm90``), which rounds q and P to fp8.

    Mirrors ``flashinfer.xqa.xqa``: fp8 cache on SM90, except, for ``L > 1``, with sinks, a
    window, or ``L * group <= 32`` (the SWAP_AB shapes), which run the generic kernel.
    """
    a, L = case.attention, case.batch.q_len
    if major != 9 or a.kv_dtype != "fp8_e4m3":
        return False
    if L == 1:
        return True
    return not a.sinks and a.window_left < 0 and L * a.group_size > 32


def xqa_build_key(case: Case) -> tuple[object, ...]:
    """What one XQA JIT module is built for (``flashinfer.jit.xqa.gen_xqa_module``'s URI):
    the dtypes, page size, head dim, head group ratio, window or not, and ``L``."""
    a = case.attention
    return (
        a.q_dtype,
        a.kv_dtype,
        a.out_dtype,
        a.page_size,
        a.head_dim,
        a.group_size,
        a.window_left >= 0,
        case.batch.q_len,
    )


def _current_major() -> int:
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0


def xqa_precision(case: Case) -> Precision:
    """Generic XQA kernel: P in the query dtype, K/V converted to it; Hopper fp8 kernel: q and P
    in fp8."""
    if uses_sm90_fp8_xqa(case, _current_major()):
        return Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
    return Precision(p_dtype=case.attention.q_dtype)


def xqa_available(env: FlashInferEnv) -> str | None:
    reason = base_reason(env)
    if reason is None and env.capability is not None and env.capability[0] not in (9, 10, 12):
        return f"XQA runs on SM90/SM100/SM120 only (this GPU is {env.arch})"
    return reason


def xqa_support(case: Case) -> str | None:
    """Limits of ``backend="xqa"`` (``flashinfer/xqa.py``, ``jit/xqa.py``, ``csrc/xqa``)."""
    a, b = case.attention, case.batch
    if a.out_dtype != a.q_dtype:
        return f"XQA writes the query dtype: out_dtype {a.out_dtype} != q_dtype {a.q_dtype}"
    if a.kv_dtype not in (a.q_dtype, "fp8_e4m3"):
        return f"XQA needs K/V in the query dtype or fp8 (kv {a.kv_dtype}, q {a.q_dtype})"
    if a.page_size not in (16, 32, 64, 128):
        return f"XQA page_size must be 16, 32, 64 or 128 (got {a.page_size})"
    if a.head_dim % 16 or not 16 <= a.head_dim <= 256:
        return f"XQA head_dim must be a multiple of 16 in [16, 256] (got {a.head_dim})"
    if b.draft.kind == "tree" and a.window_left >= 0:
        return "XQA does not support tree drafts with a sliding window (documented in xqa())"
    return None


def trtllm_gen_support(case: Case) -> str | None:
    return trtllm_gen_limits(case, "decode")


def cake_available(env: FlashInferEnv) -> str | None:
    """Cake needs a release that has it and an SM100/SM103 GPU: its target lookup raises
    ``Cake FMHA requires compute capability 10.0 ... or 10.3`` anywhere else."""
    reason = base_reason(env)
    if reason is not None:
        return reason
    if not env.api.cake:
        return (
            f"flashinfer {env.version} has no cake backend "
            "(no flashinfer.cake_batch_decode_with_kv_cache)"
        )
    if env.capability not in ((10, 0), (10, 3)):
        return (
            f"the cake backend of flashinfer {env.version} runs on SM100/SM103 only: it raises "
            f"on this GPU ({env.arch})"
        )
    return None


def cake_support(case: Case) -> str | None:
    """Limits of ``backend="cake"`` as its docstring states them (not validated here: no
    SM100)."""
    a = case.attention
    if a.kv_dtype == "fp8_e4m3":
        return "cake with an fp8 cache: its query and scale contract is not coded here"
    if case.batch.draft.kind == "tree":
        return "cake ignores mask (causal only): tree drafts unsupported"
    if a.bmm2_scale != 1.0:
        return f"cake requires bmm2_scale = 1 with a 16-bit cache (got {a.bmm2_scale:g})"
    return trtllm_gen_limits(case, "decode")


def _check(kwargs: dict[str, Any], first_use: bool, mask_by_convention: bool = False) -> None:
    """The decode contract. ``mask_by_convention``: the mask is SGLang's buffer sized by its
    draft length, not by ``L`` (the contract would refuse its shape before the launch; the
    case exists to see what the kernel does with it), so its shape is not checked here."""
    if not contracts_enabled():
        return
    check_decode_args(
        query=kwargs["query"],
        kv_cache=kwargs["kv_cache"],
        block_tables=kwargs["block_tables"],
        seq_lens=kwargs["seq_lens"],
        q_len_per_req=kwargs["q_len_per_req"],
        workspace_buffer=kwargs["workspace_buffer"],
        kv_layout=kwargs["kv_layout"],
        max_seq_len=kwargs["max_seq_len"],
        mask=None if mask_by_convention else kwargs.get("mask"),
        sinks=kwargs["sinks"],
        out=kwargs["out"],
        window_left=kwargs["window_left"],
        workspace_first_use=first_use,
        max_q_len=kwargs.get("max_q_len"),
        cum_seq_lens_q=kwargs.get("cum_seq_lens_q"),
    )


DecodeBackend = Literal["xqa", "trtllm-gen", "cake"]


def call_trtllm_decode(
    batch: Batch, workspace: torch.Tensor, backend: DecodeBackend
) -> torch.Tensor:
    """The decode paths' kernel call as a standalone script makes it:
    ``trtllm_batch_decode_with_kv_cache`` with the arguments of
    :func:`~difftest.paths.kernel_args.decode_kwargs` (``backend`` pinned). Needs torch and
    flashinfer only (``difftest export`` copies it). The paths themselves build and check the
    arguments apart (:func:`_run`), timed as preparation."""
    return launch_trtllm_decode(decode_kwargs(batch, workspace, backend))


def launch_trtllm_decode(kwargs: dict[str, Any]) -> torch.Tensor:
    """``trtllm_batch_decode_with_kv_cache(**kwargs)``: the library's call alone."""
    import flashinfer.decode

    out = call_accepting(flashinfer.decode.trtllm_batch_decode_with_kv_cache, kwargs, set())
    assert isinstance(out, torch.Tensor)
    return out


def _run(batch: Batch, backend: DecodeBackend, path: str) -> torch.Tensor:
    ws, first_use = workspace(batch.device, f"decode-{backend}")
    by_convention = backend == "xqa" and batch.case.batch.spec_draft_len is not None
    with preparing(batch.device):  # difftest's work, not the kernel's
        kwargs = decode_kwargs(batch, ws, backend)
        _check(kwargs, first_use, by_convention)
    out = launch_trtllm_decode(kwargs)
    note_backend(path, backend)
    return out


def run_xqa(batch: Batch) -> torch.Tensor:
    return _run(batch, "xqa", "fi-decode-xqa")


def run_trtllm_gen(batch: Batch) -> torch.Tensor:
    return _run(batch, "trtllm-gen", "fi-decode-trtllm-gen")


def run_cake(batch: Batch) -> torch.Tensor:
    return _run(batch, "cake", "fi-decode-cake")


def standalone_xqa(batch: Batch) -> torch.Tensor:
    """:func:`run_xqa` in a standalone script: a new zeroed workspace, no contract checks."""
    return call_trtllm_decode(batch, zeroed_workspace(batch.device), "xqa")


def standalone_trtllm_gen(batch: Batch) -> torch.Tensor:
    """:func:`run_trtllm_gen` in a standalone script: a new zeroed workspace, no checks."""
    return call_trtllm_decode(batch, zeroed_workspace(batch.device), "trtllm-gen")


def standalone_cake(batch: Batch) -> torch.Tensor:
    """:func:`run_cake` in a standalone script: a new zeroed workspace, no checks."""
    return call_trtllm_decode(batch, zeroed_workspace(batch.device), "cake")


register(
    flashinfer_path(
        name="fi-decode-xqa",
        run=run_xqa,
        standalone=standalone_xqa,
        available=xqa_available,
        limits=lambda case, env: xqa_support(case),
        side="decode",
        precision=xqa_precision,
        description="trtllm_batch_decode_with_kv_cache(backend='xqa', q_len_per_req=L, mask)",
        tags=("decode", "xqa"),
        build_key=xqa_build_key,
        pinned_backend="xqa",
        build_cost_s=20.0,  # 9-48 s cold (Runs 7-10)
    )
)
register(
    flashinfer_path(
        name="fi-decode-trtllm-gen",
        run=run_trtllm_gen,
        standalone=standalone_trtllm_gen,
        available=trtllm_gen_available,
        limits=lambda case, env: trtllm_gen_support(case),
        side="decode",
        precision=trtllm_gen_precision,
        description="trtllm_batch_decode_with_kv_cache(backend='trtllm-gen', q_len_per_req=L)",
        tags=("decode", "trtllm-gen"),
        pinned_backend="trtllm-gen",
    )
)
register(
    flashinfer_path(
        name="fi-decode-cake",
        run=run_cake,
        standalone=standalone_cake,
        available=cake_available,
        limits=lambda case, env: cake_support(case),
        side="decode",
        precision=trtllm_gen_precision,
        description="trtllm_batch_decode_with_kv_cache(backend='cake', q_len_per_req=L)",
        tags=("decode", "cake"),
        pinned_backend="cake",
    )
)
