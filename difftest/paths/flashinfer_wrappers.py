"""FlashInfer's planned wrappers over a paged cache: three paths.

- ``fi-prefill-fa2`` / ``fi-prefill-fa3``: ``BatchPrefillWithPagedKVCacheWrapper`` with
  ``causal=True`` and ``window_left`` at ``plan()``; sinks go through
  ``BatchAttentionWithAttentionSinkWrapper`` (the plain wrapper ignores ``sinks`` on fa2/fa3);
  a tree draft is a ``custom_mask`` (fa2 only: FA3 has no custom mask).
- ``fi-decode-wrapper``: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`` with
  ``L`` query tokens per request (causal inside the block), ``q_len_per_req`` given to ``plan()``
  or ``run()`` as this release takes it.

Every wrapper is constructed with its backend pinned (``backend="auto"`` may resolve to cuDNN
on SM100/103 from 0.7.2, and in 0.7.4 the tensor-core decode wrapper may route to XQA: the
"reference-like" path would silently be the kernel under test). After ``plan()`` the wrapper's
own report of what it resolved (``resolved_backend`` where the release has it, else
``_backend``) is read back; another backend than the pin raises
:class:`~difftest.paths.flashinfer_env.BackendMismatch` instead of returning an output.

Wrappers (and their JIT modules) are cached per constructor arguments and device, each with its
own zeroed workspace; a wrapper is re-planned only when its plan inputs change. The kernel calls
(:func:`call_prefill_wrapper`, :func:`call_decode_wrapper`) take where their wrapper comes from:
the paths pass this cache, ``difftest export``'s scripts a new wrapper each time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.flashinfer_api import decode_qlen_arg, resolved_backend
from difftest.paths.flashinfer_env import (
    FlashInferEnv,
    base_reason,
    confirm_backend,
    flashinfer_path,
    note_backend,
    workspace,
)
from difftest.paths.kernel_args import (
    decode_plan_kwargs,
    prefill_plan_kwargs,
    skip_softmax_kwargs,
    wrapper_kv,
    zeroed_workspace,
)
from difftest.paths.preparation import preparing
from difftest.paths.registry import Precision, register

HEAD_DIMS = (64, 128, 256)
"""Head dims the fa2/fa3 kernels are safe for (``docs/semantics.md`` §4)."""


WrapperFor = Callable[[tuple[Any, ...], Callable[[torch.Tensor], Any]], Any]
"""``(key, make) -> wrapper``: where a run gets its wrapper. ``make(workspace)`` constructs one
on a zeroed workspace; ``key`` says what for (the paths cache by it, :func:`cached_wrappers`;
a script makes a new one, :func:`new_wrappers`). The wrapper's ``plan`` and ``run`` are
called as FlashInfer's."""


@dataclass
class _Cached:
    wrapper: Any
    device: torch.device
    plan_key: tuple[Any, ...] | None = None
    plans: int = field(default=0)

    def plan(self, **kwargs: Any) -> None:
        """Plan the wrapper, unless it is planned for these inputs already."""
        _plan(self, kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.wrapper.run(*args, **kwargs)


_WRAPPERS: dict[tuple[Any, ...], _Cached] = {}
WRAPPERS_WORKSPACE = "wrappers"
"""The owner name of the one workspace all cached wrappers on a device share
(:func:`difftest.paths.flashinfer_env.workspace`)."""


def _fingerprint(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable summary of plan inputs (tensor values included, as their bytes: one copy to
    the host, not a Python object per element)."""
    items: list[tuple[str, Any]] = []
    for k in sorted(kwargs):
        v = kwargs[k]
        if isinstance(v, torch.Tensor):
            raw = v.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
            v = (str(v.dtype), tuple(v.shape), raw)
        elif isinstance(v, torch.dtype):
            v = str(v)
        items.append((k, v))
    return tuple(items)


def _wrapper(
    key: tuple[Any, ...], device: torch.device, make: Callable[[torch.Tensor], Any]
) -> _Cached:
    full = (*key, str(device))
    cached = _WRAPPERS.get(full)
    if cached is None:
        # one float workspace for every wrapper on the device, as SGLang's FlashInfer backend
        # has: a plan only reserves offsets in it, and a run uses it as scratch while it runs
        # (this process launches one thing at a time); five of 384 MiB, one a key, were most
        # of what a worker held between launches (docs/validation.md, Run 46); shared, a
        # worker holds 0.82 GiB, and the wrapper paths' GPU tests, the stored verdicts and the
        # corpus replays are unchanged on an H100 with 0.7.4 (Run 47)
        ws, _ = workspace(device, WRAPPERS_WORKSPACE)
        cached = _Cached(wrapper=make(ws), device=device)
        _WRAPPERS[full] = cached
    return cached


def _plan(cached: _Cached, kwargs: dict[str, Any]) -> None:
    with preparing(cached.device):  # difftest's plan cache, not the library's work
        key = _fingerprint(kwargs)
    if cached.plan_key != key:
        cached.wrapper.plan(**kwargs)
        cached.plan_key = key
        cached.plans += 1


def planned_backend(wrapper: Any) -> str | None:
    """What a planned wrapper (a cached one, or FlashInfer's own) says it resolved."""
    return resolved_backend(wrapper.wrapper if isinstance(wrapper, _Cached) else wrapper)


def plan_count() -> int:
    """Plans made so far in this process (tests use it to check plans are reused)."""
    return sum(c.plans for c in _WRAPPERS.values())


def cached_wrappers(device: torch.device) -> WrapperFor:
    """The paths' wrappers: one per key on ``device``, each with its own workspace, planned
    again only when its plan inputs change."""
    return lambda key, make: _wrapper(key, device, make)


def new_wrappers(device: torch.device) -> WrapperFor:
    """A standalone script's wrappers: a new one for each run, on a new zeroed workspace."""
    return lambda key, make: make(zeroed_workspace(device))


# -- support matrices -----------------------------------------------------------------------


def fa2_available(env: FlashInferEnv) -> str | None:
    reason = base_reason(env)
    if reason is None and env.capability is not None and env.capability < (8, 0):
        return f"FlashInfer fa2 needs SM80 or newer (this GPU is {env.arch})"
    return reason


def fa3_available(env: FlashInferEnv) -> str | None:
    reason = base_reason(env)
    if reason is None and env.capability != (9, 0):
        return f"FlashInfer fa3 runs on SM90 (Hopper) only (this GPU is {env.arch})"
    return reason


def _common(case: Case) -> str | None:
    a = case.attention
    if a.head_dim not in HEAD_DIMS:
        return f"FlashInfer fa2/fa3 is only safe for head_dim 64/128/256 (got {a.head_dim})"
    if a.sinks and a.out_dtype != a.q_dtype:
        return (
            "the sink wrapper writes the query dtype: "
            f"out_dtype {a.out_dtype} != q_dtype {a.q_dtype}"
        )
    return None


def fa2_support(case: Case) -> str | None:
    a, b = case.attention, case.batch
    if a.kv_dtype not in (a.q_dtype, "fp8_e4m3"):
        return f"fa2 needs K/V in the query dtype or fp8 (kv {a.kv_dtype}, q {a.q_dtype})"
    if a.sinks and b.draft.kind == "tree":
        return "the sink variant applies no custom mask: tree drafts with sinks unsupported"
    return _common(case)


def fa3_support(case: Case) -> str | None:
    a, b = case.attention, case.batch
    if a.kv_dtype != a.q_dtype:
        return (
            f"fa3 needs K/V in the query dtype (kv {a.kv_dtype}); an fp8 cache needs an fp8 "
            "query, which this path does not make"
        )
    if b.draft.kind == "tree":
        return "FlashInfer fa3 has no custom mask: tree drafts unsupported"
    return _common(case)


def decode_wrapper_support(case: Case, env: FlashInferEnv) -> str | None:
    a, b = case.attention, case.batch
    if env.decode_qlen_arg is None and b.q_len > 1:
        return f"flashinfer {env.version}: BatchDecodeWithPagedKVCacheWrapper has no q_len_per_req"
    if a.sinks:
        return "the tensor-core decode wrapper (fa2) does not apply sinks"
    if b.draft.kind == "tree":
        return "the decode wrapper is causal inside the draft block: tree drafts unsupported"
    if a.kv_dtype not in (a.q_dtype, "fp8_e4m3"):
        return f"fa2 needs K/V in the query dtype or fp8 (kv {a.kv_dtype}, q {a.q_dtype})"
    return _common(case)


def wrapper_build_key(case: Case) -> tuple[object, ...]:
    """What one fa2/fa3 prefill JIT module is built for (``get_batch_prefill_uri`` and its
    sink variant): the dtypes, the head dim, window or not, sinks or not. Page size, GQA,
    ``L`` and the mask are runtime arguments."""
    a = case.attention
    return (a.q_dtype, a.kv_dtype, a.out_dtype, a.head_dim, a.window_left >= 0, a.sinks)


def precision(case: Case) -> Precision:
    """fa2/fa3: P rounded to the query dtype before ``P @ V``."""
    return Precision(p_dtype=case.attention.q_dtype)


# -- runs ---------------------------------------------------------------------------------


def _v_scale(batch: Batch) -> float | None:
    return None if batch.bmm2_scale == 1.0 else batch.bmm2_scale


def call_prefill_wrapper(batch: Batch, backend: str, wrapper_for: WrapperFor) -> torch.Tensor:
    """``fi-prefill-fa2``/``-fa3``'s kernel call: ``BatchPrefillWithPagedKVCacheWrapper``, or
    with sinks ``BatchAttentionWithAttentionSinkWrapper``, planned with
    :func:`~difftest.paths.kernel_args.prefill_plan_kwargs` and run. Needs torch and flashinfer
    only (``difftest export`` copies it)."""
    import flashinfer

    kv, layout = wrapper_kv(batch)
    a = batch.case.attention
    if batch.sinks is None:
        wrapper = wrapper_for(
            ("prefill", backend, layout),
            lambda ws: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend=backend),
        )
    else:
        q_dtype, kv_dtype, window = batch.q.dtype, batch.kv_cache.dtype, batch.window_left
        wrapper = wrapper_for(
            ("sink", backend, layout, q_dtype, kv_dtype, a.head_dim, window),
            lambda ws: flashinfer.BatchAttentionWithAttentionSinkWrapper(
                ws,
                kv_layout=layout,
                backend=backend,
                q_data_type=q_dtype,
                kv_data_type=kv_dtype,
                head_dim_qk=a.head_dim,
                head_dim_vo=a.head_dim,
                window_left=window,
            ),
        )
    wrapper.plan(**prefill_plan_kwargs(batch))
    kind = "BatchPrefillWithPagedKVCacheWrapper" if batch.sinks is None else "the sink wrapper"
    confirm_backend(kind, backend, planned_backend(wrapper))
    out = batch.new_output()
    skip = skip_softmax_kwargs(batch)  # passed as a caller would (fa2/fa3 do not apply it)
    if batch.sinks is None:
        result = wrapper.run(batch.q, kv, out=out, v_scale=_v_scale(batch), **skip)
    else:
        result = wrapper.run(
            batch.q, kv, batch.sinks, batch.bmm1_scale, out=out, v_scale=_v_scale(batch), **skip
        )
    assert isinstance(result, torch.Tensor)
    return result


def call_decode_wrapper(batch: Batch, wrapper_for: WrapperFor) -> torch.Tensor:
    """``fi-decode-wrapper``'s kernel call: ``BatchDecodeWithPagedKVCacheWrapper`` with tensor
    cores, planned with :func:`~difftest.paths.kernel_args.decode_plan_kwargs` and run, with
    ``q_len_per_req`` where this release takes it. Needs torch and flashinfer only
    (``difftest export`` copies it)."""
    import flashinfer

    kv, layout = wrapper_kv(batch)
    wrapper = wrapper_for(
        ("decode", "fa2", layout),
        lambda ws: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, layout, use_tensor_cores=True, backend="fa2"
        ),
    )
    plan_kwargs = decode_plan_kwargs(batch)
    run_kwargs: dict[str, Any] = {
        "out": batch.new_output(),
        "v_scale": _v_scale(batch),
        **skip_softmax_kwargs(batch),  # passed as a caller would (fa2 does not apply it)
    }
    where = decode_qlen_arg(flashinfer.BatchDecodeWithPagedKVCacheWrapper)
    if where == "plan":
        plan_kwargs["q_len_per_req"] = batch.q_len
    elif batch.q_len > 1:
        run_kwargs["q_len_per_req"] = batch.q_len
    wrapper.plan(**plan_kwargs)
    confirm_backend("BatchDecodeWithPagedKVCacheWrapper", "fa2", planned_backend(wrapper))
    result = wrapper.run(batch.q, kv, **run_kwargs)
    assert isinstance(result, torch.Tensor)
    return result


def run_fa2(batch: Batch) -> torch.Tensor:
    out = call_prefill_wrapper(batch, "fa2", cached_wrappers(batch.device))
    note_backend("fi-prefill-fa2", "fa2")  # confirmed against the wrapper's report
    return out


def run_fa3(batch: Batch) -> torch.Tensor:
    out = call_prefill_wrapper(batch, "fa3", cached_wrappers(batch.device))
    note_backend("fi-prefill-fa3", "fa3")
    return out


def run_decode_wrapper(batch: Batch) -> torch.Tensor:
    out = call_decode_wrapper(batch, cached_wrappers(batch.device))
    note_backend("fi-decode-wrapper", "fa2")
    return out


def standalone_fa2(batch: Batch) -> torch.Tensor:
    """:func:`run_fa2` in a standalone script: a new wrapper on a new workspace."""
    return call_prefill_wrapper(batch, "fa2", new_wrappers(batch.device))


def standalone_fa3(batch: Batch) -> torch.Tensor:
    """:func:`run_fa3` in a standalone script: a new wrapper on a new workspace."""
    return call_prefill_wrapper(batch, "fa3", new_wrappers(batch.device))


def standalone_decode_wrapper(batch: Batch) -> torch.Tensor:
    """:func:`run_decode_wrapper` in a standalone script: a new wrapper on a new workspace."""
    return call_decode_wrapper(batch, new_wrappers(batch.device))


register(
    flashinfer_path(
        name="fi-prefill-fa2",
        run=run_fa2,
        standalone=standalone_fa2,
        available=fa2_available,
        limits=lambda case, env: fa2_support(case),
        side="prefill",
        precision=precision,
        description="BatchPrefillWithPagedKVCacheWrapper(backend='fa2'), causal, window at plan",
        tags=("prefill", "wrapper", "fa2"),
        build_key=wrapper_build_key,
        pinned_backend="fa2",
        build_cost_s=100.0,  # 50-140 s cold (Runs 7-10)
    )
)
register(
    flashinfer_path(
        name="fi-prefill-fa3",
        run=run_fa3,
        standalone=standalone_fa3,
        available=fa3_available,
        limits=lambda case, env: fa3_support(case),
        side="prefill",
        precision=precision,
        description="BatchPrefillWithPagedKVCacheWrapper(backend='fa3'), causal, window at plan",
        tags=("prefill", "wrapper", "fa3"),
        build_key=wrapper_build_key,
        pinned_backend="fa3",
        build_cost_s=180.0,  # 100-240 s cold (Runs 7-10)
    )
)
register(
    flashinfer_path(
        name="fi-decode-wrapper",
        run=run_decode_wrapper,
        standalone=standalone_decode_wrapper,
        available=fa2_available,
        limits=decode_wrapper_support,
        side="decode",
        precision=precision,
        description="BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True), L rows/request",
        tags=("decode", "wrapper", "fa2"),
        build_key=wrapper_build_key,
        pinned_backend="fa2",
        build_cost_s=100.0,  # 50-140 s cold (Runs 7-10)
    )
)
