"""Every FlashInfer path AGREEs with the oracle on handpicked cases, grouped by compile variant.

Each :class:`Variant` is one JIT module per path (FlashInfer keys modules by dtypes, page size,
head dim, GQA ratio, window on/off and, for XQA, ``L``), so its cases share one cold compile;
``-n N --dist loadgroup`` sends each variant to one worker. Runtime shape (batch, prefixes up to
8k, page order, table width and fill, storage, convention, padding, values) varies freely
inside a variant. Run with ``pytest -n 4 --dist loadgroup tests/gpu``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from difftest.execution.evaluate import evaluate
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)
from difftest.model.outcome import Outcome
from difftest.paths import get_path

TREE4 = TreeDraft(parents=(-1, 0, 0, 1))
TREE6 = TreeDraft(parents=(-1, 0, 1, 0, 3, 1))


def case(
    attn: dict[str, Any],
    prefixes: tuple[int, ...],
    L: int,
    *,
    mode: str = "target_verify",
    tree: TreeDraft | None = None,
    storage: str = "kv_split_nhd",
    convention: str = "sglang",
    pad_requests: int = 0,
    pad_rows: int = 0,
    order: str = "shuffled",
    fill: str = "stale_pages",
    values: str = "randn",
    seed: int = 7,
) -> Case:
    """One case: ``attn`` are AttentionConfig fields; the pool is SGLang-like by default."""
    a = AttentionConfig(**attn)
    longest = max(prefixes) + L
    return Case(
        attention=a,
        batch=BatchSpec(
            mode=mode,  # type: ignore[arg-type]
            prefix_lens=prefixes,
            q_len=L,
            draft=tree or CausalDraft(),
            padding_requests=pad_requests,
            padding_rows=pad_rows,
        ),
        pool=PoolSpec(
            kv_storage=storage,  # type: ignore[arg-type]
            page_order=order,  # type: ignore[arg-type]
            spare_pages=2,
            table_width="context",
            table_fill=fill,  # type: ignore[arg-type]
            stale_fill="large",
            context_len=max(4096, 2 * longest),
        ),
        values=ValueSpec(family=values),  # type: ignore[arg-type]
        convention=convention,  # type: ignore[arg-type]
        seed=seed,
    )


@dataclass(frozen=True)
class Variant:
    name: str
    paths: tuple[str, ...]
    cases: tuple[Case, ...]


LLAMA = {"num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 128, "page_size": 64}
QWEN = {"num_qo_heads": 16, "num_kv_heads": 1, "head_dim": 256, "page_size": 16}
GPT_OSS = {
    "num_qo_heads": 8,
    "num_kv_heads": 1,
    "head_dim": 64,
    "page_size": 64,
    "window_left": 127,
    "sinks": True,
}
FP8 = {"kv_dtype": "fp8_e4m3", "k_scale": 0.25, "v_scale": 0.5}
MHA_FP8 = {"num_qo_heads": 4, "num_kv_heads": 4, "head_dim": 128, "page_size": 64, **FP8}
FP16_WIN = {
    "num_qo_heads": 8,
    "num_kv_heads": 4,
    "head_dim": 128,
    "page_size": 32,
    "q_dtype": "fp16",
    "kv_dtype": "fp16",
    "out_dtype": "fp16",
    "window_left": 31,
}

VARIANTS = (
    # XQA: one module per (dtypes, page, head_dim, GQA ratio, window, L).
    Variant(
        "xqa-bf16-p64-d128-g4-L4",
        ("fi-decode-xqa",),
        (
            case(LLAMA, (8000, 3), 4),
            case(LLAMA, (0, 65, 130), 4, mode="draft_extend_v2", pad_requests=2, storage="hnd"),
            case(LLAMA, (500, 17), 4, tree=TREE4, storage="nhd"),
            case(LLAMA | {"sinks": True}, (200,), 4, convention="plain", values="large_logits"),
            case(LLAMA, (33, 1000), 4, mode="draft_extend_v2", pad_rows=3, order="reversed"),
            # Last: page ids far past the pool in the columns no request uses.
            case(LLAMA, (100, 2), 4, fill="out_of_range"),
        ),
    ),
    Variant(
        "xqa-bf16-p16-d256-g16-L2",
        ("fi-decode-xqa",),
        (
            case(QWEN, (3000, 1, 40), 2),  # one KV head per rank: the canonicalised stride
            case(QWEN, (15, 16), 2, mode="draft_extend_v2", storage="hnd", values="near_ties"),
        ),
    ),
    Variant(
        "xqa-bf16-p64-d64-g8-win-L4",
        ("fi-decode-xqa",),
        (
            case(GPT_OSS, (8000, 100), 4),  # window 127 far from the start, and inside it
            case(GPT_OSS, (129, 3), 4, mode="draft_extend_v2", storage="nhd"),
        ),
    ),
    Variant(
        "xqa-fp8-p32-d128-g8-L8",  # L * group = 64 > 32: the Hopper fp8 kernel (q, P in fp8)
        ("fi-decode-xqa",),
        (
            case(LLAMA | FP8 | {"page_size": 32, "num_kv_heads": 1}, (2000, 9), 8),
            case(LLAMA | FP8 | {"page_size": 32, "num_kv_heads": 1}, (64,), 8, storage="hnd"),
        ),
    ),
    Variant(
        "xqa-fp8-p64-d128-g1-L3",  # GQA 1, generic kernel with an fp8 cache
        ("fi-decode-xqa",),
        (case(MHA_FP8, (700, 40), 3), case(MHA_FP8, (5,), 3, convention="plain")),
    ),
    Variant(
        "xqa-fp16-p32-d128-g2-win-L6",
        ("fi-decode-xqa",),
        (
            case(FP16_WIN, (300, 20), 6, mode="draft_extend_v2"),
            case(FP16_WIN, (4000,), 6, tree=None, storage="hnd"),
        ),
    ),
    # fa2 (BatchPrefill and the tensor-core BatchDecode share the module).
    Variant(
        "fa2-bf16-d128",
        ("fi-prefill-fa2", "fi-decode-wrapper"),
        (
            case(LLAMA, (8000, 3), 4),
            case(LLAMA, (0, 65, 130), 5, mode="draft_extend_v2", pad_requests=1, storage="hnd"),
            case(LLAMA, (40, 17), 2, storage="nhd", convention="plain"),
        ),
    ),
    Variant(
        "fa2-bf16-d128-tree",
        ("fi-prefill-fa2",),
        (case(LLAMA, (500, 17), 4, tree=TREE4), case(LLAMA, (9,), 6, tree=TREE6, storage="hnd")),
    ),
    Variant(
        "fa2-bf16-d64-win",
        ("fi-decode-wrapper",),
        (case(GPT_OSS | {"sinks": False}, (8000, 100), 4),),
    ),
    Variant(
        "fa2-sink-bf16-d64-win",
        ("fi-prefill-fa2",),
        (case(GPT_OSS, (8000, 100), 4), case(GPT_OSS, (129, 3), 4, storage="hnd")),
    ),
    Variant(
        "fa2-fp8-d128",
        ("fi-prefill-fa2", "fi-decode-wrapper"),
        (case(MHA_FP8, (700, 40), 3),),
    ),
    # fa3 (~100 s cold): one module.
    Variant(
        "fa3-bf16-d128",
        ("fi-prefill-fa3",),
        (
            case(LLAMA, (8000, 3), 4),
            case(LLAMA, (0, 65, 130), 8, mode="draft_extend_v2", storage="hnd"),
            case(LLAMA, (40, 17), 2, storage="nhd", convention="plain"),
        ),
    ),
    # FMHAv2 (~170 s cold): one module per layout and query dtype; all head dims inside it.
    Variant(
        "fmha-v2-bf16-hnd",
        ("fi-context-fmha-v2",),
        (
            case(LLAMA, (8000, 3), 4, storage="hnd"),
            case(LLAMA, (0, 65, 130), 4, mode="draft_extend_v2", storage="hnd", pad_rows=3),
            case(GPT_OSS, (8000, 100), 4, storage="hnd"),
            case(QWEN, (3000, 1), 2, storage="hnd", pad_requests=1),
            case(LLAMA, (40, 17), 7, convention="plain"),
            case(LLAMA, (100, 2), 4, storage="nhd", fill="out_of_range"),
        ),
    ),
)

PARAMS = [
    pytest.param(path, c, id=f"{v.name}-{path}-{i}", marks=pytest.mark.xdist_group(v.name))
    for v in VARIANTS
    for path in v.paths
    for i, c in enumerate(v.cases)
]


@pytest.mark.parametrize(("path_name", "spec"), PARAMS)
def test_path_agrees_with_the_oracle(
    path_name: str, spec: Case, device: torch.device, record: Any
) -> None:
    path = get_path(path_name)
    reason = path.support(spec, device)
    assert reason is None, f"{path_name} refuses a case chosen for it: {reason}"
    result = evaluate(spec, [path], device, check_determinism=True).results[0]
    record(
        {
            "path": path_name,
            "digest": spec.digest(),
            "outcome": result.outcome.value,
            "reason": result.reason,
            "metrics": result.metrics,
            "seconds": result.seconds,
            "case": spec.to_json(),
        }
    )
    assert result.outcome is Outcome.AGREE, (
        f"{path_name}: {result.outcome.value}: {result.reason}; case {spec.canonical_json()}"
    )


# FMHAv2 with SGLang's split K/V buffers depends on the release (its (k, v) form):
# test_versions.py checks it by the detected API.
UNSUPPORTED_ON_H200 = [
    ("fi-decode-trtllm-gen", case(LLAMA, (10,), 4), "SM100/SM103 only"),
    ("fi-context-trtllm-gen", case(LLAMA, (10,), 4), "SM100/SM103 only"),
    ("fi-prefill-fa3", case(LLAMA, (10,), 4, tree=TREE4), "no custom mask"),
    ("fi-decode-wrapper", case(GPT_OSS, (10,), 4), "does not apply sinks"),
    ("fi-decode-xqa", case(GPT_OSS, (10,), 4, tree=TREE4), "tree drafts with a sliding window"),
]


@pytest.mark.parametrize(("path_name", "spec", "why"), UNSUPPORTED_ON_H200)
def test_unsupported_cases_are_reported_with_their_reason(
    path_name: str, spec: Case, why: str, device: torch.device
) -> None:
    if torch.cuda.get_device_capability(device) != (9, 0):
        pytest.skip("the expectations are for an SM90 GPU")
    result = evaluate(spec, [get_path(path_name)], device).results[0]
    assert result.outcome is Outcome.UNSUPPORTED
    assert why in result.reason
