"""The FlashInfer adapters' support matrices with a fake device (no GPU, no flashinfer)."""

from __future__ import annotations

import dataclasses
import sys
from types import ModuleType
from typing import Any

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.model.case import AttentionConfig, BatchSpec, Case, CausalDraft, PoolSpec, TreeDraft
from difftest.paths import flashinfer_context as ctx
from difftest.paths import flashinfer_decode as dec
from difftest.paths import flashinfer_env as fienv
from difftest.paths import flashinfer_wrappers as wrp
from difftest.paths import get_path, kernel_args
from difftest.paths.flashinfer_api import FlashInferApi
from difftest.paths.registry import Precision

API_616 = FlashInferApi(decode_qlen_arg="plan")
"""What detection says of 0.6.16.post4 (pinned in tests/unit/test_flashinfer_api.py)."""
API_074 = FlashInferApi(
    decode_qlen_arg="plan",
    decode_wrapper_reports="resolved_backend",
    context_backend_arg=True,
    fmha_v2_split_kv=True,
    cake=True,
)
H200 = fienv.FlashInferEnv(
    device_type="cuda", capability=(9, 0), version="0.6.16.post4", api=API_616
)
H200_074 = dataclasses.replace(H200, version="0.7.4", api=API_074)
B200 = dataclasses.replace(H200, capability=(10, 0))
RTX = dataclasses.replace(H200, capability=(12, 0))
A100 = dataclasses.replace(H200, capability=(8, 0))
T4 = dataclasses.replace(H200, capability=(7, 5))
FI_PATHS = (
    "fi-decode-xqa",
    "fi-decode-trtllm-gen",
    "fi-context-trtllm-gen",
    "fi-context-fmha-v2",
    "fi-prefill-fa2",
    "fi-prefill-fa3",
    "fi-decode-wrapper",
    "fi-decode-cake",
)


def make(**attn: Any) -> Case:
    """A Llama-like case; ``attn`` overrides attention fields, ``L``/``tree``/... the rest."""
    L = attn.pop("L", 4)
    tree = attn.pop("tree", False)
    storage = attn.pop("storage", "kv_split_nhd")
    convention = attn.pop("convention", "sglang")
    fields = {"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 64} | attn
    draft = TreeDraft(parents=(-1, *[i // 2 for i in range(L - 1)])) if tree else CausalDraft()
    return Case(
        attention=AttentionConfig(**fields),
        batch=BatchSpec(
            mode="target_verify",
            prefix_lens=(100, 7),
            q_len=L,
            draft=draft,
        ),
        pool=PoolSpec(kv_storage=storage),
        convention=convention,
    )


# Per-rank configurations of docs/semantics.md §5, each with page sizes 16/32/64 and L 2..8.
MODELS = [
    {"num_qo_heads": 4, "num_kv_heads": 1, "head_dim": 128},  # Llama-3.1-8B TP8
    {"num_qo_heads": 16, "num_kv_heads": 1, "head_dim": 256},  # Qwen3.5 TP2
    {"num_qo_heads": 16, "num_kv_heads": 2, "head_dim": 256},  # Qwen3-Next
    {"num_qo_heads": 64, "num_kv_heads": 8, "head_dim": 64, "window_left": 127, "sinks": True},
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("L", [2, 4, 8])
def test_production_configurations_are_supported_on_an_h200(
    model: dict[str, Any], page_size: int, L: int
) -> None:
    case = make(page_size=page_size, L=L, **model)
    assert dec.xqa_available(H200) is None and dec.xqa_support(case) is None
    assert wrp.fa2_available(H200) is None and wrp.fa2_support(case) is None
    assert wrp.fa3_available(H200) is None and wrp.fa3_support(case) is None
    plain = dataclasses.replace(case, convention="plain")
    assert ctx.fmha_v2_available(H200) is None and ctx.fmha_v2_support(plain, H200) is None
    if not model.get("sinks"):
        assert wrp.decode_wrapper_support(case, H200) is None


def test_base_reasons() -> None:
    assert fienv.base_reason(H200) is None
    cpu = fienv.FlashInferEnv(device_type="cpu")
    assert fienv.base_reason(cpu) == "needs a CUDA GPU (device is cpu)"
    missing = dataclasses.replace(H200, version=None, problem="No module named 'flashinfer'")
    assert fienv.base_reason(missing) == (
        "flashinfer is not importable: No module named 'flashinfer'"
    )
    old = dataclasses.replace(H200, version="0.6.10")
    assert fienv.base_reason(old) == "flashinfer 0.6.10 is older than the supported 0.6.11"


def test_version_parsing() -> None:
    assert fienv.version_tuple("0.6.16.post4") == (0, 6, 16)
    assert fienv.version_tuple("0.6.11") == (0, 6, 11)
    assert fienv.version_tuple("0.7.0rc1+cu130") == (0, 7, 0)


def test_architectures() -> None:
    for env in (H200, B200, RTX):
        assert dec.xqa_available(env) is None
    assert "SM90/SM100/SM120 only (this GPU is SM80)" in str(dec.xqa_available(A100))
    assert dec.trtllm_gen_available(B200) is None
    assert dec.trtllm_gen_available(dataclasses.replace(H200, capability=(10, 3))) is None
    for fn in (dec.trtllm_gen_available, ctx.trtllm_gen_available):
        assert fn(H200) == "TRT-LLM gen kernels exist for SM100/SM103 only (this GPU is SM90)"
    assert ctx.fmha_v2_available(H200) is None and ctx.fmha_v2_available(RTX) is None
    assert "SM90 and SM12x only (this GPU is SM100)" in str(ctx.fmha_v2_available(B200))
    assert wrp.fa2_available(A100) is None and wrp.fa2_available(B200) is None
    assert "SM80 or newer (this GPU is SM75)" in str(wrp.fa2_available(T4))
    assert wrp.fa3_available(H200) is None
    assert "SM90 (Hopper) only (this GPU is SM100)" in str(wrp.fa3_available(B200))


def test_xqa_limits() -> None:
    assert "page_size must be 16, 32, 64 or 128 (got 8)" in str(dec.xqa_support(make(page_size=8)))
    assert "multiple of 16 in [16, 256] (got 72)" in str(dec.xqa_support(make(head_dim=72)))
    assert dec.xqa_support(make(head_dim=80)) is None
    assert "out_dtype fp16 != q_dtype bf16" in str(dec.xqa_support(make(out_dtype="fp16")))
    assert "kv fp16, q bf16" in str(dec.xqa_support(make(kv_dtype="fp16")))
    assert dec.xqa_support(make(kv_dtype="fp8_e4m3")) is None
    assert dec.xqa_support(make(tree=True)) is None  # the packed mask carries the tree
    assert dec.xqa_support(make(sinks=True, window_left=5)) is None
    assert "tree drafts with a sliding window" in str(
        dec.xqa_support(make(tree=True, window_left=5))
    )


def test_trtllm_gen_limits() -> None:
    assert "tree drafts unsupported" in str(dec.trtllm_gen_support(make(tree=True)))
    assert "tree drafts unsupported" in str(ctx.trtllm_gen_support(make(tree=True)))
    assert dec.trtllm_gen_support(make(kv_dtype="fp8_e4m3", sinks=True, window_left=9)) is None
    assert "head_dim 64/128/256 (got 96)" in str(ctx.trtllm_gen_support(make(head_dim=96)))


def test_fmha_v2_limits() -> None:
    assert ctx.fmha_v2_support(make(), H200) == (
        "flashinfer 0.6.16.post4: trtllm_fmha_v2_prefill takes no (k, v) tuple and addresses "
        "the pool as one [pages, 2, ...] tensor, ignoring strides: SGLang's split K/V buffers "
        "cannot be passed"
    )
    assert ctx.fmha_v2_support(make(), H200_074) is None  # (q, (k, v)) with [B, 2, M] offsets
    for storage in ("hnd", "nhd"):
        assert ctx.fmha_v2_support(make(storage=storage), H200) is None
    assert ctx.fmha_v2_support(make(convention="plain"), H200) is None  # passed contiguous
    assert "no draft mask" in str(ctx.fmha_v2_support(make(tree=True, storage="hnd"), H200))
    assert "head_dim 72" in str(ctx.fmha_v2_support(make(head_dim=72, storage="hnd"), H200))
    assert ctx.fmha_v2_support(make(head_dim=96, storage="hnd"), H200) is None
    assert "head_dim 96" in str(ctx.fmha_v2_support(make(head_dim=96, storage="hnd"), RTX))
    assert "power of two" in str(ctx.fmha_v2_support(make(page_size=24, storage="hnd"), H200))
    fp8 = make(kv_dtype="fp8_e4m3", storage="hnd")
    assert ctx.fmha_v2_support(fp8, H200) is None
    assert "no fp8 (e4m3) kernels on SM120" in str(ctx.fmha_v2_support(fp8, RTX))
    assert "out_dtype fp16" in str(ctx.fmha_v2_support(make(out_dtype="fp16", storage="hnd"), H200))


def test_wrapper_limits() -> None:
    assert "head_dim 64/128/256 (got 96)" in str(wrp.fa2_support(make(head_dim=96)))
    assert wrp.fa2_support(make(kv_dtype="fp8_e4m3")) is None
    assert "an fp8 query" in str(wrp.fa3_support(make(kv_dtype="fp8_e4m3")))
    assert wrp.fa2_support(make(tree=True, window_left=3)) is None
    assert "no custom mask" in str(wrp.fa3_support(make(tree=True)))
    assert "tree drafts with sinks" in str(wrp.fa2_support(make(tree=True, sinks=True)))
    assert "sink wrapper writes the query dtype" in str(
        wrp.fa2_support(make(sinks=True, out_dtype="fp16"))
    )
    assert wrp.fa2_support(make(out_dtype="fp16")) is None  # o_data_type at plan()
    assert "does not apply sinks" in str(wrp.decode_wrapper_support(make(sinks=True), H200))
    assert "tree drafts unsupported" in str(wrp.decode_wrapper_support(make(tree=True), H200))
    old = dataclasses.replace(H200, api=FlashInferApi(decode_qlen_arg=None))
    assert "has no q_len_per_req" in str(wrp.decode_wrapper_support(make(), old))
    assert wrp.decode_wrapper_support(make(L=1), old) is None
    run = dataclasses.replace(H200, api=FlashInferApi(decode_qlen_arg="run"))
    assert wrp.decode_wrapper_support(make(), run) is None


def test_cake_is_a_path_where_the_release_has_it_and_says_why_not_on_sm90() -> None:
    assert dec.cake_available(H200) == (
        "flashinfer 0.6.16.post4 has no cake backend "
        "(no flashinfer.cake_batch_decode_with_kv_cache)"
    )
    assert dec.cake_available(H200_074) == (
        "the cake backend of flashinfer 0.7.4 runs on SM100/SM103 only: it raises on this GPU "
        "(SM90)"
    )
    for cc in ((10, 0), (10, 3)):
        assert dec.cake_available(dataclasses.replace(H200_074, capability=cc)) is None
    assert dec.cake_available(dataclasses.replace(H200, capability=(10, 0))) is not None
    assert dec.cake_support(make()) is None
    assert "bmm2_scale = 1" in str(dec.cake_support(make(v_scale=0.5)))
    assert "tree drafts unsupported" in str(dec.cake_support(make(tree=True)))
    assert "fp8 cache" in str(dec.cake_support(make(kv_dtype="fp8_e4m3")))


def test_every_path_whose_call_can_choose_a_backend_pins_it() -> None:
    pins = {name: get_path(name).pinned_backend for name in FI_PATHS}
    assert pins == {
        "fi-decode-xqa": "xqa",
        "fi-decode-trtllm-gen": "trtllm-gen",
        "fi-context-trtllm-gen": "trtllm-gen",
        "fi-context-fmha-v2": None,  # trtllm_fmha_v2_prefill has no backend argument
        "fi-prefill-fa2": "fa2",
        "fi-prefill-fa3": "fa3",
        "fi-decode-wrapper": "fa2",
        "fi-decode-cake": "cake",
    }
    assert all(get_path(n).backend is not None for n, pin in pins.items() if pin)


def test_precision_declarations() -> None:
    fp8 = make(kv_dtype="fp8_e4m3", num_qo_heads=64, num_kv_heads=1)  # L * group = 256 > 32
    assert dec.uses_sm90_fp8_xqa(fp8, 9)
    assert not dec.uses_sm90_fp8_xqa(fp8, 10)
    assert not dec.uses_sm90_fp8_xqa(make(kv_dtype="fp8_e4m3"), 9)  # 4 * 4 <= 32: SWAP_AB shape
    assert not dec.uses_sm90_fp8_xqa(
        dataclasses.replace(fp8, attention=dataclasses.replace(fp8.attention, sinks=True)), 9
    )
    assert dec.uses_sm90_fp8_xqa(make(kv_dtype="fp8_e4m3", L=1), 9)
    assert dec.trtllm_gen_precision(fp8) == Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
    assert dec.trtllm_gen_precision(make()) == Precision(p_dtype="bf16")
    assert ctx.fmha_v2_precision(make(q_dtype="fp16", out_dtype="fp16")).p_dtype == "fp16"
    assert wrp.precision(make(kv_dtype="fp8_e4m3")) == Precision(p_dtype="bf16")


def test_registered_paths_refuse_a_cpu_with_a_reason() -> None:
    case = make()
    for name in FI_PATHS:
        path = get_path(name)
        assert path.support(case, torch.device("cpu")) == "needs a CUDA GPU (device is cpu)"
        assert "flashinfer" in path.tags


def test_registered_paths_consult_the_probed_device(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every FlashInfer path reads the device through flashinfer_env.probe_env (flashinfer_path).
    monkeypatch.setattr(fienv, "probe_env", lambda device: H200)
    cuda = torch.device("cuda")
    case = make(storage="hnd")
    supported = {name: get_path(name).support(case, cuda) for name in FI_PATHS}
    sm100_only = "TRT-LLM gen kernels exist for SM100/SM103 only (this GPU is SM90)"
    assert supported == {
        "fi-decode-xqa": None,
        "fi-decode-trtllm-gen": sm100_only,
        "fi-context-trtllm-gen": sm100_only,
        "fi-context-fmha-v2": None,
        "fi-prefill-fa2": None,
        "fi-prefill-fa3": None,
        "fi-decode-wrapper": None,
        "fi-decode-cake": "flashinfer 0.6.16.post4 has no cake backend "
        "(no flashinfer.cake_batch_decode_with_kv_cache)",
    }


class _FakeWrapper:
    def __init__(self) -> None:
        self.plans: list[dict[str, Any]] = []

    def plan(self, **kwargs: Any) -> None:
        self.plans.append(kwargs)


def test_wrappers_are_cached_and_plans_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrp, "_WRAPPERS", {})
    made: list[_FakeWrapper] = []

    def make_wrapper(ws: torch.Tensor) -> _FakeWrapper:
        assert ws.dtype == torch.uint8 and not ws.any()
        made.append(_FakeWrapper())
        return made[-1]

    monkeypatch.setattr(fienv, "_WORKSPACES", {})
    monkeypatch.setattr(kernel_args, "WORKSPACE_BYTES", 1024)

    cpu = torch.device("cpu")
    first = wrp._wrapper(("prefill", "fa2", "HND"), cpu, make_wrapper)
    assert wrp._wrapper(("prefill", "fa2", "HND"), cpu, make_wrapper) is first
    assert len(made) == 1
    a = materialize(make(storage="hnd"))
    b = materialize(dataclasses.replace(a.case, seed=99))  # same shape, other values
    wrp._plan(first, kernel_args.prefill_plan_kwargs(a))
    wrp._plan(first, kernel_args.prefill_plan_kwargs(b))
    assert len(made[0].plans) == 1  # identical plan inputs: planned once
    c = materialize(make(storage="hnd", window_left=3))
    wrp._plan(first, kernel_args.prefill_plan_kwargs(c))
    assert len(made[0].plans) == 2 and made[0].plans[-1]["window_left"] == 3
    assert wrp.plan_count() == 2


def test_the_cached_wrappers_share_one_workspace_and_xqa_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wrp, "_WRAPPERS", {})
    monkeypatch.setattr(fienv, "_WORKSPACES", {})
    monkeypatch.setattr(kernel_args, "WORKSPACE_BYTES", 1024)
    given: list[torch.Tensor] = []

    def make_wrapper(ws: torch.Tensor) -> _FakeWrapper:
        given.append(ws)
        return _FakeWrapper()

    cpu = torch.device("cpu")
    keys = [("prefill", "fa2", "HND"), ("prefill", "fa2", "NHD"), ("decode", "fa2", "HND")]
    wrappers = [wrp._wrapper(key, cpu, make_wrapper) for key in keys]
    assert len({id(w) for w in wrappers}) == 3  # a wrapper a key (its own plan)
    assert all(ws is given[0] for ws in given)  # on one workspace
    assert len(fienv._WORKSPACES) == 1
    xqa, first_use = fienv.workspace(cpu, "decode-xqa")  # XQA's semaphores: a buffer of its own
    assert first_use and xqa.data_ptr() != given[0].data_ptr()


class _Resolving:
    """A decode wrapper of a release with ``resolved_backend``: its plan resolves to
    ``picks`` (0.7.4's tensor-core ``auto`` may pick XQA for some graph shapes)."""

    picks = "fa2"

    def __init__(self, ws: torch.Tensor, layout: str, **kwargs: Any) -> None:
        self.asked = kwargs["backend"]
        self._resolved = "auto"

    @property
    def resolved_backend(self) -> str:
        return self._resolved

    def plan(self, **kwargs: Any) -> None:
        self._resolved = self.picks

    def run(self, q: torch.Tensor, kv: Any, **kwargs: Any) -> torch.Tensor:
        out = kwargs["out"]
        assert isinstance(out, torch.Tensor)
        return out.zero_()


@pytest.mark.parametrize("picks", ["fa2", "xqa"])
def test_the_decode_wrapper_reads_back_what_ran_and_refuses_another_backend(
    picks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper_cls = type("BatchDecodeWithPagedKVCacheWrapper", (_Resolving,), {"picks": picks})
    wrapper_cls.plan = lambda self, q_len_per_req=1, **kw: _Resolving.plan(self)  # type: ignore[method-assign]
    fake = ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = wrapper_cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(fienv, "_WORKSPACES", {})
    monkeypatch.setattr(wrp, "_WRAPPERS", {})
    monkeypatch.setattr(kernel_args, "WORKSPACE_BYTES", 1024)
    batch = materialize(make(storage="hnd", L=3))
    path = get_path("fi-decode-wrapper")
    if picks == "fa2":
        out = path.run(batch)
        assert out.shape[0] == batch.case.batch.num_query_rows
        assert path.backend is not None and path.backend() == "fa2"
        assert path.backend() is None  # read once: a later failed run reports nothing stale
    else:
        with pytest.raises(fienv.BackendMismatch) as e:
            path.run(batch)
        assert str(e.value) == (
            "BatchDecodeWithPagedKVCacheWrapper was pinned to backend='fa2' but reports "
            "'xqa': the output is another kernel's"
        )
        assert path.backend is not None and path.backend() is None


def test_each_result_records_the_backend_that_ran_and_keeps_it_in_json() -> None:
    from difftest.execution.evaluate import evaluate
    from difftest.model.outcome import PathResult
    from difftest.model.strict_json import Reader
    from difftest.paths import register, unregister
    from difftest.paths.registry import KernelPath

    ran: list[str] = []

    def run(batch: Any) -> torch.Tensor:
        from difftest.judgement.tolerance import reference

        ran.append("cpu-ref")
        return reference(batch).to(batch.q.dtype)

    register(
        KernelPath(
            name="t-pinned",
            run=run,
            pinned_backend="cpu-ref",
            backend=lambda: ran.pop() if ran else None,
        )
    )
    try:
        case = make(storage="hnd", convention="plain")
        [result] = evaluate(case, [get_path("t-pinned")]).results
    finally:
        unregister("t-pinned")
    assert result.backend == "cpu-ref"
    data = result.to_json()
    assert data["backend"] == "cpu-ref"
    assert PathResult.from_json(Reader(data, "test", "result")).backend == "cpu-ref"
    assert "backend" not in dataclasses.replace(result, backend="").to_json()


def test_the_environment_stamp_names_the_pins_and_the_detected_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from difftest.machine import environment

    monkeypatch.setattr(fienv, "probe_env", lambda device: H200_074)
    environment.stamp.cache_clear()
    try:
        env = environment.stamp("cuda")
    finally:
        environment.stamp.cache_clear()
    assert env.flashinfer_api == API_074.describe()
    assert env.backends is not None
    assert "fi-decode-wrapper=fa2" in env.backends and "fi-decode-cake=cake" in env.backends
    assert "fi-context-fmha-v2" not in env.backends  # it has no backend to pin
    assert "flashinfer API: decode wrapper: q_len_per_req at plan()" in env.describe()
