"""What differs between FlashInfer releases, checked on the installed one (issue 17).

- the API detection equals what the release's recorded signatures say (the CPU tests pin the
  records; this ties them to the library really imported);
- every path that pins a backend records that the pinned backend ran, the decode wrapper read
  back from the wrapper itself; on releases whose tensor-core ``auto`` can route to XQA, what
  ``auto`` would have picked is recorded beside it;
- ``cake``: where the release has it and the GPU is not SM100/103, a call raises as the path's
  availability reason says;
- FMHAv2 takes SGLang's split K/V buffers as ``(k, v)`` with ``[B, 2, M]`` offsets where the
  release has that form, and is unsupported with its reason elsewhere;
- SGLang's XQA mask buffer sized by the speculative draft length, in draft-extend batches whose
  ``L`` is shorter: the kernel must agree with the oracle; if it does not, the failure is a
  finding against SGLang's calling convention, and the rows it got wrong are recorded next to
  the rows predicted by XQA's mask indexing (``tests/_xqa_mask_reading.py``).

Cases reuse the compile variants of ``test_flashinfer_paths.py`` (same ``xdist_group``), so
this file adds almost no JIT builds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from _api_records import DATA, stand_in
from _api_records import record as api_record
from _xqa_mask_reading import misread_rows
from test_flashinfer_paths import GPT_OSS, LLAMA, QWEN, case

from difftest.execution.evaluate import evaluate
from difftest.model.outcome import Outcome
from difftest.paths import get_path
from difftest.paths.flashinfer_api import detect
from difftest.paths.flashinfer_env import probe_env
from difftest.paths.kernel_args import decode_kwargs, zeroed_workspace

GROUPS = {
    "fi-decode-xqa": "xqa-bf16-p64-d128-g4-L4",
    "fi-prefill-fa2": "fa2-bf16-d128",
    "fi-decode-wrapper": "fa2-bf16-d128",
    "fi-prefill-fa3": "fa3-bf16-d128",
    "fi-context-fmha-v2": "fmha-v2-bf16-hnd",
}
"""The variant group (of test_flashinfer_paths.py) whose module each check below uses."""


def _flashinfer() -> Any:
    import flashinfer
    import flashinfer.decode
    import flashinfer.prefill

    return flashinfer


def test_detection_matches_the_recorded_release(device: torch.device, record: Any) -> None:
    fi = _flashinfer()
    api = probe_env(device).api
    record({"check": "api", "flashinfer": fi.__version__, "api": dataclasses.asdict(api)})
    assert api == detect(fi)
    recorded = DATA / f"{fi.__version__}.json"
    if not recorded.is_file():
        pytest.skip(f"no recorded API for flashinfer {fi.__version__} in {DATA}")
    assert detect(stand_in(api_record(fi.__version__))) == api


@pytest.mark.parametrize(
    "path_name",
    [pytest.param(p, marks=pytest.mark.xdist_group(g)) for p, g in GROUPS.items()],
)
def test_each_result_records_the_backend_its_path_pinned(
    path_name: str, device: torch.device, record: Any
) -> None:
    path = get_path(path_name)
    storage = "hnd" if path_name == "fi-context-fmha-v2" else "kv_split_nhd"
    spec = case(LLAMA, (300, 17), 4, storage=storage)
    assert path.support(spec, device) is None
    result = evaluate(spec, [path], device).results[0]
    record(
        {
            "check": "backend",
            "path": path_name,
            "pinned": path.pinned_backend,
            "ran": result.backend,
            "outcome": result.outcome.value,
            "reason": result.reason,
        }
    )
    assert result.outcome is Outcome.AGREE, result.reason
    assert result.backend == (path.pinned_backend or "")


@pytest.mark.xdist_group("fa2-bf16-d128")
def test_the_decode_wrapper_is_fa2_where_auto_would_route_elsewhere(
    device: torch.device, record: Any
) -> None:
    """On a shape 0.7.4's tensor-core ``auto`` sends to XQA (SM90, CUDA graphs, fp16, D=128,
    pages of 16, 32:8 heads, 16 requests of 1024 tokens, L=4), record what ``auto`` resolves
    to; the path itself, pinned to fa2, must report fa2 for the same batch shape."""
    fi = _flashinfer()
    api = probe_env(device).api
    bs, L, kv_len, ps = 16, 4, 1024, 16
    pages = kv_len // ps
    indptr = torch.arange(bs + 1, dtype=torch.int32, device=device) * pages
    indices = torch.arange(bs * pages, dtype=torch.int32, device=device)
    last = torch.full((bs,), ps, dtype=torch.int32, device=device)
    auto: dict[str, Any] = {"check": "auto-routing", "flashinfer": fi.__version__}
    if api.decode_wrapper_reports == "resolved_backend":
        try:
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                zeroed_workspace(device),
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=indptr.clone(),
                paged_kv_indices_buffer=indices.clone(),
                paged_kv_last_page_len_buffer=last.clone(),
                backend="auto",
            )
            wrapper.plan(
                indptr,
                indices,
                last,
                32,
                8,
                128,
                ps,
                q_data_type=torch.float16,
                kv_data_type=torch.float16,
                q_len_per_req=L,
            )
            auto["auto_resolved"] = wrapper.resolved_backend
        except Exception as e:  # recorded: what auto does here is the evidence wanted
            auto["auto_error"] = f"{type(e).__name__}: {e}"
    else:
        auto["auto_resolved"] = "not reported by this release (no resolved_backend)"
    path = get_path("fi-decode-wrapper")
    spec = case(
        LLAMA | {"num_qo_heads": 32, "num_kv_heads": 8, "page_size": ps},
        (kv_len - L,) * bs,
        L,
        storage="nhd",
    )
    result = evaluate(spec, [path], device).results[0]
    auto |= {"pinned_ran": result.backend, "outcome": result.outcome.value}
    record(auto)
    assert result.outcome is Outcome.AGREE, result.reason
    assert result.backend == "fa2"


@pytest.mark.xdist_group("xqa-bf16-p64-d128-g4-L4")
def test_cake_runs_where_the_release_and_gpu_have_it_and_raises_as_said_elsewhere(
    device: torch.device, record: Any
) -> None:
    env = probe_env(device)
    path = get_path("fi-decode-cake")
    reason = path.availability(device)
    row: dict[str, Any] = {"check": "cake", "available": reason}
    if not env.api.cake:
        record(row)
        assert reason is not None and "has no cake backend" in reason
        return
    spec = case(LLAMA, (300, 17), 4, storage="hnd")
    if reason is None:  # SM100/103
        result = evaluate(spec, [path], device).results[0]
        record(row | {"outcome": result.outcome.value, "reason": result.reason})
        assert result.outcome is Outcome.AGREE, result.reason
        return
    from difftest.generation.materialize import materialize

    fi = _flashinfer()
    kwargs = decode_kwargs(materialize(spec, device), zeroed_workspace(device), "cake")
    with pytest.raises(Exception) as raised:
        fi.decode.trtllm_batch_decode_with_kv_cache(**kwargs)
        torch.cuda.synchronize(device)
    row["raised"] = f"{type(raised.value).__name__}: {raised.value}"
    record(row)
    assert "compute capability" in str(raised.value), row["raised"]


@pytest.mark.xdist_group("fmha-v2-bf16-hnd")
@pytest.mark.parametrize("which", ["llama", "gpt-oss", "qwen-one-kv-head"])
def test_fmha_v2_takes_sglangs_split_buffers_where_the_release_has_the_form(
    which: str, device: torch.device, record: Any
) -> None:
    attn = {"llama": LLAMA, "gpt-oss": GPT_OSS, "qwen-one-kv-head": QWEN}[which]
    spec = case(attn, (2000, 3, 130), 4, mode="draft_extend_v2", pad_rows=2)
    path = get_path("fi-context-fmha-v2")
    result = evaluate(spec, [path], device).results[0]
    api = probe_env(device).api
    record(
        {
            "check": "fmha-v2-split",
            "case": which,
            "form": api.fmha_v2_split_kv,
            "outcome": result.outcome.value,
            "reason": result.reason,
        }
    )
    if not api.fmha_v2_split_kv:
        assert result.outcome is Outcome.UNSUPPORTED
        assert "takes no (k, v) tuple" in result.reason
        return
    assert result.outcome is Outcome.AGREE, result.reason


DRAFT_LEN_CASES = [
    pytest.param(LLAMA, 4, 5, id="L4-D5", marks=pytest.mark.xdist_group("xqa-bf16-p64-d128-g4-L4")),
    pytest.param(LLAMA, 4, 8, id="L4-D8", marks=pytest.mark.xdist_group("xqa-bf16-p64-d128-g4-L4")),
    pytest.param(QWEN, 2, 4, id="L2-D4", marks=pytest.mark.xdist_group("xqa-bf16-p16-d256-g16-L2")),
]


@pytest.mark.parametrize(("attn", "L", "draft_len"), DRAFT_LEN_CASES)
def test_xqa_with_sglangs_mask_buffer_sized_by_the_draft_length(
    attn: dict[str, Any], L: int, draft_len: int, device: torch.device, record: Any
) -> None:
    spec = case(attn, (500, 40, 3, 77), L, mode="draft_extend_v2", pad_requests=1)
    spec = spec.replace(batch=dataclasses.replace(spec.batch, spec_draft_len=draft_len))
    path = get_path("fi-decode-xqa")
    assert path.support(spec, device) is None
    result = evaluate(spec, [path], device).results[0]
    wrong = {e.request: e.rows for e in result.metrics.errors}
    predicted = misread_rows(L, draft_len, spec.batch.num_requests)
    record(
        {
            "check": "xqa-draft-len",
            "L": L,
            "draft_len": draft_len,
            "outcome": result.outcome.value,
            "reason": result.reason,
            "wrong_rows": {str(k): list(v) for k, v in wrong.items()},
            "predicted_rows": {str(k): list(v) for k, v in predicted.items()},
            "as_predicted": wrong == predicted,
            "case": spec.to_json(),
        }
    )
    assert result.outcome is Outcome.AGREE, (
        f"finding against SGLang's calling convention: XQA given the mask buffer sized by the "
        f"draft length {draft_len} with L={L}: {result.outcome.value}: {result.reason}; wrong "
        f"rows per request {wrong}, predicted from XQA's mask indexing {predicted}"
    )
