"""Ragged verify (issue 18): requests with different numbers of new tokens.

The oracle lays ragged requests out in a uniform frame; here each ragged batch is checked
against a per-request reference (each request alone, as a uniform batch of its own ``L_b`` rows
and the draft mask's top-left ``L_b x L_b`` block), and the rest of the pipeline (the case
model, the kernel arguments, path support, triage and the shrinker) is checked to take them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)
from difftest.model.errors import InvalidCase
from difftest.model.outcome import CaseResult, Metrics, Outcome, PathResult
from difftest.oracle.attention import paged_attention_reference
from difftest.paths import get_path
from difftest.paths.kernel_args import decode_kwargs
from difftest.paths.modes import PathModes
from difftest.reduction import ShrinkBudget, shrink
from difftest.triage.features import labels

CPU = torch.device("cpu")


def ragged_case(
    q_lens: tuple[int, ...],
    prefixes: tuple[int, ...],
    *,
    draft: CausalDraft | TreeDraft | None = None,
    window_left: int = -1,
    sinks: bool = False,
    page_size: int = 4,
    seed: int = 3,
) -> Case:
    L = max(q_lens)
    return Case(
        attention=AttentionConfig(
            num_qo_heads=4,
            num_kv_heads=2,
            head_dim=16,
            page_size=page_size,
            window_left=window_left,
            sinks=sinks,
        ),
        batch=BatchSpec(
            mode="target_verify",
            prefix_lens=prefixes,
            q_len=L,
            draft=draft or CausalDraft(),
            q_lens=q_lens if min(q_lens) < L else None,
        ),
        pool=PoolSpec(page_order="shuffled", spare_pages=2, table_width="context"),
        values=ValueSpec(family="randn"),
        seed=seed,
    )


def per_request_reference(case: Case) -> torch.Tensor:
    """float64 ``[R, H_q, D]``: each request alone, uniform with its own ``L_b`` rows."""
    batch = materialize(case, CPU)
    counts = case.batch.new_tokens()
    firsts = case.batch.first_rows()
    parts = []
    for b, n in enumerate(counts):
        tree = case.batch.draft.kind == "tree"
        parts.append(
            paged_attention_reference(
                batch.q[firsts[b] : firsts[b] + n],
                batch.k_pages,
                batch.v_pages,
                batch.block_tables[b : b + 1],
                batch.seq_lens[b : b + 1],
                n,
                bmm1_scale=batch.bmm1_scale,
                bmm2_scale=batch.bmm2_scale,
                window_left=batch.window_left,
                sinks=batch.sinks,
                draft_mask=batch.draft_mask[:n, :n] if tree else None,
            )
        )
    return torch.cat(parts)


CASES = {
    "chain": ragged_case((3, 1, 4, 2), (5, 0, 9, 13)),
    "tree": ragged_case((4, 2, 3), (6, 11, 2), draft=TreeDraft(parents=(-1, 0, 0, 1))),
    "window": ragged_case((1, 4, 2), (17, 3, 21), window_left=5),
    "sinks": ragged_case((2, 4), (7, 1), sinks=True),
    "tree-window-sinks": ragged_case(
        (3, 1, 4), (30, 4, 12), draft=TreeDraft(parents=(-1, 0, 1, 0)), window_left=3, sinks=True
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ragged_batches_through_the_oracle_match_each_request_alone(name: str) -> None:
    case = CASES[name]
    assert case.batch.is_ragged
    batch = materialize(case, CPU)
    assert batch.q.shape[0] == sum(case.batch.new_tokens())
    got = paged_attention_reference(
        batch.q,
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.q_len,
        bmm1_scale=batch.bmm1_scale,
        bmm2_scale=batch.bmm2_scale,
        window_left=batch.window_left,
        sinks=batch.sinks,
        draft_mask=None if batch.is_chain_draft else batch.draft_mask,
        q_lens=batch.new_tokens(),
    )
    want = per_request_reference(case)
    assert got.shape == want.shape
    # The same float64 arithmetic, over other key counts (the frame pads to the longest
    # request): equal up to float64 rounding of the sums.
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_uniform_batch_is_the_special_case_of_all_counts_equal() -> None:
    uniform = ragged_case((3, 3, 3), (4, 9, 1))
    assert uniform.batch.q_lens is None and not uniform.batch.is_ragged
    batch = materialize(uniform, CPU)
    args = (batch.q, batch.k_pages, batch.v_pages, batch.block_tables, batch.seq_lens, 3)
    kw = {"bmm1_scale": batch.bmm1_scale, "bmm2_scale": batch.bmm2_scale}
    plain = paged_attention_reference(*args, **kw)
    counted = paged_attention_reference(*args, **kw, q_lens=torch.tensor([3, 3, 3]))
    assert torch.equal(plain, counted)
    torch.testing.assert_close(plain, per_request_reference(uniform), rtol=1e-12, atol=1e-12)


def test_the_case_model_checks_the_counts_and_keeps_old_digests() -> None:
    b = BatchSpec(mode="target_verify", prefix_lens=(1, 2), q_len=3)
    for bad, why in (
        ((3,), "one count per real request"),
        ((3, 0), "each in [1, q_len=3]"),
        ((2, 2), "the largest must be q_len=3"),
        ((3, 3), "uniform case"),
    ):
        with pytest.raises(InvalidCase, match=why.replace("[", r"\[").replace("]", r"\]")):
            dataclasses.replace(b, q_lens=bad)
    case = CASES["chain"]
    assert "q_lens" in case.to_json()["batch"]
    assert Case.from_json(case.to_json()) == case
    uniform = case.replace(batch=dataclasses.replace(case.batch, q_lens=None))
    assert "q_lens" not in uniform.to_json()["batch"]


def test_the_decode_api_gets_the_ragged_form() -> None:
    batch = materialize(CASES["chain"], CPU)
    kwargs = decode_kwargs(batch, torch.zeros(8, dtype=torch.uint8), "trtllm-gen")
    assert kwargs["q_len_per_req"] is None  # else max_q_len is overwritten with it (facts.md)
    assert kwargs["max_q_len"] == 4
    assert kwargs["cum_seq_lens_q"].tolist() == [0, 3, 4, 8, 10]
    assert kwargs["query"].shape[0] == 10


def test_paths_that_take_no_ragged_batch_say_why() -> None:
    case = CASES["chain"]
    declared = {
        name: get_path(name).modes.reason(name, case, CPU)
        for name in (
            "fi-decode-xqa",
            "fi-decode-wrapper",
            "fi-decode-trtllm-gen",
            "fi-context-trtllm-gen",
            "fi-context-fmha-v2",
            "fi-prefill-fa2",
            "fi-prefill-fa3",
            "torch-sdpa",
            "torch-paged-online",
        )
    }
    assert declared["fi-decode-xqa"] is not None and "fi-xqa-ragged" in declared["fi-decode-xqa"]
    assert declared["fi-decode-wrapper"] is not None
    assert "q_len_per_req" in declared["fi-decode-wrapper"]
    for name in (
        "fi-decode-trtllm-gen",
        "fi-context-trtllm-gen",
        "fi-context-fmha-v2",
        "fi-prefill-fa2",
        "fi-prefill-fa3",
        "torch-sdpa",
        "torch-paged-online",
    ):
        assert declared[name] is None, name
    undeclared = PathModes().reason("some-path", case, CPU)
    assert undeclared is not None and "declares no ragged support" in undeclared
    uniform = case.replace(batch=BatchSpec(mode="target_verify", prefix_lens=(1, 2), q_len=2))
    assert PathModes().reason("some-path", uniform, CPU) is None


def test_the_cpu_paths_agree_on_ragged_batches() -> None:
    paths = [get_path("torch-sdpa"), get_path("torch-paged-online")]
    for name, case in CASES.items():
        result = evaluate(case, paths, CPU)
        assert [r.outcome for r in result.results] == [Outcome.AGREE] * 2, name


def test_triage_names_ragged_batches() -> None:
    assert "ragged" in labels(CASES["chain"])
    uniform = CASES["chain"].replace(batch=dataclasses.replace(CASES["chain"].batch, q_lens=None))
    assert "ragged" not in labels(uniform)


def _wrong_when(rule: object) -> object:
    class Executor:
        def __init__(self) -> None:
            self.paths = [get_path("torch-sdpa")]
            self.device = CPU
            self.stop_at: float | None = None

        def evaluate(
            self, case: Case, *, check_determinism: bool = False, only: object = None
        ) -> CaseResult:
            bad = rule(case)  # type: ignore[operator]
            outcome = Outcome.WRONG if bad else Outcome.AGREE
            result = PathResult(
                path="torch-sdpa",
                outcome=outcome,
                detail="tolerance" if bad else "",
                metrics=Metrics(max_abs=1.0 if bad else 0.0),
            )
            return CaseResult(case_digest=case.digest(), results=(result,))

        def close(self) -> None:
            pass

    return Executor()


def test_the_shrinker_keeps_raggedness_only_when_the_failure_needs_it() -> None:
    big = ragged_case((4, 1, 3, 2, 4), (20, 9, 33, 7, 12), page_size=8)
    # Fails whenever some request has fewer new tokens than another (needs raggedness).
    needs = _wrong_when(lambda c: c.batch.is_ragged)
    first = needs.evaluate(big).results[0]  # type: ignore[attr-defined]
    out = shrink(big, first, needs, budget=ShrinkBudget(max_runs=400, max_seconds=120))  # type: ignore[arg-type]
    small = out.case.batch
    assert small.is_ragged and small.q_lens is not None
    assert len(small.prefix_lens) == 2 and small.q_len == 2 and sorted(small.q_lens) == [1, 2]
    assert out.result.result_for("torch-sdpa").outcome is Outcome.WRONG
    # Fails on any multi-token batch: the counts are made uniform (the special case).
    either = _wrong_when(lambda c: c.batch.q_len >= 2)
    first = either.evaluate(big).results[0]  # type: ignore[attr-defined]
    out = shrink(big, first, either, budget=ShrinkBudget(max_runs=400, max_seconds=120))  # type: ignore[arg-type]
    assert out.case.batch.q_lens is None and out.case.batch.q_len == 2


def test_a_batch_builds_its_row_layouts_once_and_they_stay_right() -> None:
    """``new_tokens``, ``row_requests`` and ``frame_rows`` are built once per batch (every
    path, the oracle and each judgement read them) and are what the case says."""
    batch = materialize(ragged_case((3, 1, 2), (5, 0, 9)))
    assert batch.new_tokens() is batch.new_tokens()
    assert batch.row_requests() is batch.row_requests()
    assert batch.frame_rows() is batch.frame_rows()
    assert batch.new_tokens().tolist() == [3, 1, 2]
    assert batch.row_requests().tolist() == [0, 0, 0, 1, 2, 2]
    # Frame of L = 3 slots per request, each request's rows in its last slots.
    assert batch.frame_rows().tolist() == [0, 1, 2, 5, 7, 8]
    other = materialize(ragged_case((1, 3), (2, 2)))
    assert other.row_requests().tolist() == [0, 1, 1, 1]  # not the first batch's
