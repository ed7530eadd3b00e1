"""The production modes on the GPU (issue 18): CUDA-graph replay against eager, ragged verify,
skip-softmax. The cases reuse the compile variants of ``test_flashinfer_paths.py`` (same
dtypes, page size, head dim, GQA ratio, ``L``) so that they share its modules; each result is
recorded as a JSON line (``gpu_results.jsonl``) with the graph's differing elements and host
arguments, or the skip allowance it used.

Run: ``pytest -n 4 --dist loadgroup tests/gpu/test_modes.py`` (or ``ci/h200_modes.sh``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from test_flashinfer_paths import LLAMA, case

from difftest.execution import graph_replay
from difftest.execution.evaluate import evaluate
from difftest.judgement.skip_softmax import ARGUMENT
from difftest.model.case import Case
from difftest.model.graph_spec import GraphSpec
from difftest.model.outcome import Outcome, PathResult
from difftest.paths import get_path

STATIC = GraphSpec(extra_requests=2, extra_columns=3, extra_pages=4, seed=1)


def _graphed(spec: Case, graph: GraphSpec = STATIC) -> Case:
    return spec.replace(convention="sglang", graph=graph)


def _record(record: Any, test: str, path: str, spec: Case, result: PathResult) -> None:
    record(
        {
            "test": test,
            "path": path,
            "digest": spec.digest(),
            "outcome": result.outcome.value,
            "detail": result.detail,
            "reason": result.reason,
            "metrics": result.metrics,
            "backend": result.backend,
            "case": spec.to_json(),
        }
    )


def _run(path_name: str, spec: Case, device: torch.device) -> PathResult:
    path = get_path(path_name)
    reason = path.support(spec, device)
    if reason is not None:
        pytest.skip(f"{path_name}: {reason}")
    return evaluate(spec, [path], device).results[0]


# -- graph replay ---------------------------------------------------------------------------

GRAPH_PATHS = {
    "fi-decode-xqa": ("xqa-bf16-p64-d128-g4-L4", 4),
    "fi-prefill-fa2": ("fa2-bf16-d128", 4),
    "fi-decode-wrapper": ("fa2-bf16-d128", 4),
    "fi-decode-trtllm-gen": ("trtllm-gen-bf16-d128", 4),  # SM100/103: says why elsewhere
}
GRAPH_CASES = {
    "two-requests": lambda L: case(LLAMA, (700, 3), L, storage="hnd"),
    "padding": lambda L: case(LLAMA, (64, 130), L, pad_requests=1, storage="hnd"),
    "long": lambda L: case(LLAMA, (5000,), L, storage="hnd"),
}
GRAPH_PARAMS = [
    pytest.param(p, c, id=f"{p}-{c}", marks=pytest.mark.xdist_group(group))
    for p, (group, _) in GRAPH_PATHS.items()
    for c in GRAPH_CASES
]


@pytest.fixture(autouse=True)
def fresh_static_buffers() -> Any:
    graph_replay.clear()
    yield
    graph_replay.clear()


@pytest.mark.parametrize(("path_name", "which"), GRAPH_PARAMS)
def test_a_captured_graph_replays_the_eager_bits(
    path_name: str, which: str, device: torch.device, record: Any
) -> None:
    spec = _graphed(GRAPH_CASES[which](GRAPH_PATHS[path_name][1]))
    result = _run(path_name, spec, device)
    _record(record, "graph-bits", path_name, spec, result)
    diff = result.metrics.graph
    assert diff is not None and diff.captured, f"{path_name} was not captured: {result.reason}"
    assert (diff.stale_columns, diff.stale_pages) == (3, 4)
    assert result.outcome is Outcome.AGREE, f"{result.outcome.value}: {result.reason}"
    assert diff.differing_elements == 0


HOST_CHANGES = {
    "max_seq_len+4096": dataclasses.replace(STATIC, extra_max_seq_len=4096),
    "max_seq_len+1": dataclasses.replace(STATIC, extra_max_seq_len=1),
    "scales": dataclasses.replace(STATIC, bmm1_scale=0.125, bmm2_scale=2.0),
}
HOST_PARAMS = [
    pytest.param(p, h, id=f"{p}-{h}", marks=pytest.mark.xdist_group(group))
    for p, (group, _) in GRAPH_PATHS.items()
    for h in HOST_CHANGES
]


@pytest.mark.parametrize(("path_name", "change"), HOST_PARAMS)
def test_host_arguments_changed_since_capture_are_recorded_and_judged(
    path_name: str, change: str, device: torch.device, record: Any
) -> None:
    """A graph captured with other host arguments (issue #4647: trtllm-gen decode reads the
    host ``max_seq_len``): the replay is judged against the oracle of what it was given and
    bit for bit against eager; a difference is GRAPH_MISMATCH naming the host argument."""
    spec = _graphed(GRAPH_CASES["two-requests"](GRAPH_PATHS[path_name][1]), HOST_CHANGES[change])
    result = _run(path_name, spec, device)
    _record(record, "graph-host", path_name, spec, result)
    diff = result.metrics.graph
    assert diff is not None and diff.captured
    host = {h.name: (h.replay, h.eager) for h in diff.host_args}
    # the static table is STATIC.extra_columns wider than the case's: always a host difference
    replay_width, eager_width = host.pop("page_table_width")
    assert replay_width == eager_width + STATIC.extra_columns
    names = set(host)
    assert names == ({"bmm1_scale", "bmm2_scale"} if change == "scales" else {"max_seq_len"})
    if result.outcome is Outcome.WRONG:
        # Wrong against the oracle of the scales it was captured with: the graph is not at
        # fault when its replay is the eager call at those scales bit for bit and that call is
        # wrong alone (on flashinfer 0.6.16.post4 to 0.7.4, XQA's bmm2_scale bug at
        # bmm2_scale=2: corpus entry xqa-bmm2-scale-ignored).
        assert change == "scales" and diff.differing_elements == 0, result.reason
        g = spec.graph
        assert g is not None and g.bmm1_scale is not None and g.bmm2_scale is not None
        at_capture = dataclasses.replace(
            spec.attention, sm_scale=g.bmm1_scale, q_scale=1.0, k_scale=1.0,
            v_scale=g.bmm2_scale, o_scale=1.0,
        )  # fmt: skip
        eager = _run(path_name, spec.replace(attention=at_capture, graph=None), device)
        _record(record, "graph-host-eager-at-capture-scales", path_name, spec, eager)
        assert eager.outcome is Outcome.WRONG, f"{eager.outcome.value}: {eager.reason}"
        return
    assert result.outcome in (Outcome.AGREE, Outcome.GRAPH_MISMATCH), result.reason
    if result.outcome is Outcome.GRAPH_MISMATCH:
        assert diff.differing_elements > 0
        assert next(iter(names)) in result.reason  # the differing input is named


# -- ragged verify --------------------------------------------------------------------------

RAGGED_PATHS = {
    "fi-xqa-ragged": ("xqa-ragged-bf16-p64-d128-g4-L4", LLAMA),
    "fi-prefill-fa2": ("fa2-bf16-d128", LLAMA),
    "fi-context-fmha-v2": ("fmha-v2-bf16-hnd", LLAMA),
    "fi-decode-trtllm-gen": ("trtllm-gen-bf16-d128", LLAMA),
    "fi-context-trtllm-gen": ("trtllm-gen-context-bf16-d128", LLAMA),
}
RAGGED_CASES = {
    "mixed": ((700, 3, 90), (4, 1, 3)),
    "one-long": ((6000, 17), (2, 4)),
}
RAGGED_PARAMS = [
    pytest.param(p, c, id=f"{p}-{c}", marks=pytest.mark.xdist_group(group))
    for p, (group, _) in RAGGED_PATHS.items()
    for c in RAGGED_CASES
]


def _ragged(attn: dict[str, Any], which: str) -> Case:
    prefixes, counts = RAGGED_CASES[which]
    base = case(attn, prefixes, max(counts), storage="hnd")
    return base.replace(batch=dataclasses.replace(base.batch, q_lens=counts))


@pytest.mark.parametrize(("path_name", "which"), RAGGED_PARAMS)
def test_ragged_batches_agree_with_the_oracle(
    path_name: str, which: str, device: torch.device, record: Any
) -> None:
    spec = _ragged(RAGGED_PATHS[path_name][1], which)
    assert spec.batch.is_ragged
    result = _run(path_name, spec, device)
    _record(record, "ragged", path_name, spec, result)
    assert result.outcome is Outcome.AGREE, f"{result.outcome.value}: {result.reason}"


@pytest.mark.parametrize("path_name", ["fi-decode-xqa", "fi-decode-wrapper"])
def test_paths_without_ragged_queries_say_so(path_name: str, device: torch.device) -> None:
    reason = get_path(path_name).support(_ragged(LLAMA, "mixed"), device)
    assert reason is not None
    assert ("fi-xqa-ragged" if path_name == "fi-decode-xqa" else "q_len_per_req") in reason


# -- skip-softmax ---------------------------------------------------------------------------

SKIP_PATHS = {
    "fi-decode-xqa": ("xqa-bf16-p64-d128-g4-L4", "ignores"),
    "fi-prefill-fa2": ("fa2-bf16-d128", "ignores"),
    "fi-context-fmha-v2": ("fmha-v2-bf16-hnd", "honours"),  # SM90 warp-specialised kernels
    "fi-decode-trtllm-gen": ("trtllm-gen-bf16-d128", "honours"),
}
SKIP_FACTORS = (0.01, 1.0, 4.0)
SKIP_PARAMS = [
    pytest.param(p, f, v, id=f"{p}-{f}-{v}", marks=pytest.mark.xdist_group(group))
    for p, (group, _) in SKIP_PATHS.items()
    for f in SKIP_FACTORS
    for v in ("randn", "large_logits")
]


@pytest.mark.parametrize(("path_name", "factor", "values"), SKIP_PARAMS)
def test_skip_softmax_is_within_its_bound_or_reported_ignored(
    path_name: str, factor: float, values: str, device: torch.device, record: Any
) -> None:
    base = case(LLAMA, (6000, 300), 4, storage="hnd", values=values)
    spec = base.replace(
        attention=dataclasses.replace(base.attention, skip_softmax_threshold_scale_factor=factor)
    )
    result = _run(path_name, spec, device)
    _record(record, "skip-softmax", path_name, spec, result)
    declared = get_path(path_name).modes.skip(spec, device)
    assert declared == SKIP_PATHS[path_name][1]
    if declared == "ignores":
        assert result.outcome is Outcome.IGNORES, f"{result.outcome.value}: {result.reason}"
        assert result.detail == ARGUMENT
    else:
        assert result.outcome is Outcome.AGREE, f"{result.outcome.value}: {result.reason}"
        assert result.metrics.skip_allowance is not None
