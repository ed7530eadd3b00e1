"""The shrink driver and its passes, against a fake executor whose verdict is a rule on the
case (no tensors): what is accepted, what is refused, what is spent."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from difftest.execution.evaluate import run_path
from difftest.generation.materialize import materialize
from difftest.judgement.signature import Signature, signature_of
from difftest.judgement.tolerance import judge, reference
from difftest.model.batch import Batch
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)
from difftest.model.outcome import CaseResult, Metrics, Outcome, PathResult
from difftest.model.strict_json import Reader
from difftest.paths.registry import KernelPath
from difftest.reduction import ShrinkBudget, shrink
from difftest.reduction.probe import build, search_down

Rule = Callable[[Case], PathResult]


def _never(batch: object) -> torch.Tensor:
    raise AssertionError("the fake path is never run")


class FakeExecutor:
    """Answers ``rule(case)`` for one path named ``fake``; records what it was asked."""

    def __init__(
        self, rule: Rule, supports: Callable[[Case, torch.device], str | None] | None = None
    ):
        self.paths = [KernelPath(name="fake", run=_never, supports=supports)]
        self.device = torch.device("cpu")
        self.rule = rule
        self.calls: list[tuple[Case, bool]] = []
        self.only: list[tuple[str, ...] | None] = []
        self.stop_at: float | None = None

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        self.calls.append((case, check_determinism))
        self.only.append(tuple(only) if only is not None else None)
        return CaseResult(case_digest=case.digest(), results=(self.rule(case),))

    def close(self) -> None:
        pass


def wrong(reason: str = "over tolerance") -> PathResult:
    return PathResult(
        path="fake", outcome=Outcome.WRONG, reason=reason, detail="tolerance", metrics=Metrics()
    )


AGREE = PathResult(path="fake", outcome=Outcome.AGREE)

BIG = Case(
    attention=AttentionConfig(
        num_qo_heads=8,
        num_kv_heads=2,
        head_dim=128,
        page_size=16,
        window_left=50,
        sinks=True,
        kv_dtype="fp8_e4m3",
        k_scale=0.5,
        v_scale=2.0,
        sm_scale=0.3,
    ),
    batch=BatchSpec(
        mode="target_verify",
        prefix_lens=(70, 25, 33, 120, 19),
        q_len=6,
        draft=TreeDraft(parents=(-1, 0, 0, 1, 2, 3)),
        padding_requests=2,
        padding_rows=3,
    ),
    pool=PoolSpec(
        kv_storage="kv_split_nhd",
        page_order="shuffled",
        spare_pages=3,
        shared_prefix_pages=1,
        table_width="context",
        table_fill="stale_pages",
        stale_fill="large",
        context_len=300,
    ),
    values=ValueSpec(family="near_ties", scale=2.0),
    convention="sglang",
    seed=1234,
)

SIMPLEST = Case(
    # Page size 1: the page-size pass tries the smallest pages first (a failure that needs
    # several pages then needs the fewest tokens); this failure needs none.
    attention=AttentionConfig(num_qo_heads=1, num_kv_heads=1, head_dim=16, page_size=1),
    batch=BatchSpec(mode="target_verify", prefix_lens=(0, 20), q_len=1),
    convention="plain",
)


def second_prefix_at_least_20(case: Case) -> PathResult:
    lens = case.batch.prefix_lens
    return wrong() if len(lens) >= 2 and lens[1] >= 20 else AGREE


def test_everything_the_failure_does_not_need_is_shrunk_away() -> None:
    ex = FakeExecutor(second_prefix_at_least_20)
    out = shrink(BIG, wrong(), ex, budget=ShrinkBudget(max_runs=500, max_seconds=600))
    assert out.case == SIMPLEST
    info = out.report
    assert info.reproduced is True
    assert info.original_size == BIG.size() > info.shrunk_size == SIMPLEST.size()
    assert info.original_digest == BIG.digest()
    assert info.shrunk_digest == SIMPLEST.digest()
    assert info.runs == len(ex.calls) <= 80  # 58 when written, 73 with the request trade
    assert info.slips == ()
    assert info.exhausted is False
    assert {"drop_requests", "prefix_lens", "q_len", "head_dim", "kv_heads"} <= set(info.passes)
    assert out.result.result_for("fake") == wrong()
    # the first run is the original, rerun to check it reproduces
    assert ex.calls[0][0] == BIG


def test_shrinking_is_deterministic() -> None:
    runs = []
    for _ in range(2):
        ex = FakeExecutor(second_prefix_at_least_20)
        shrink(BIG, wrong(), ex)
        runs.append([c.digest() for c, _ in ex.calls])
    assert runs[0] == runs[1]


def test_an_original_that_does_not_reproduce_is_returned_unchanged_with_both_results() -> None:
    ex = FakeExecutor(lambda case: AGREE)
    out = shrink(BIG, wrong("first time"), ex)
    assert out.case == BIG
    assert out.report.reproduced is False
    assert out.report.runs == 1
    assert "did not reproduce" in out.report.message
    assert "WRONG (tolerance) vs oracle first, fake AGREE on the rerun" in out.report.message
    # the campaign writes the original finding, not the agreeing rerun
    assert out.result.result_for("fake") == wrong("first time")


def test_other_failures_are_kept_as_slips_and_never_followed() -> None:
    def rule(case: Case) -> PathResult:
        if case.batch.q_len < 3:
            return PathResult(
                path="fake",
                outcome=Outcome.RAISED,
                reason="ValueError: L too small",
                detail="ValueError",
            )
        if case.attention.window_left < 0:
            nan = {"unwritten_rows": 0, "nonfinite": 3}
            return PathResult(path="fake", outcome=Outcome.NONFINITE, reason="3 NaN", metrics=nan)
        return second_prefix_at_least_20(case)

    ex = FakeExecutor(rule)
    out = shrink(BIG, wrong(), ex)
    assert out.case.batch.q_len == 3
    assert out.case.attention.window_left == 0  # smaller, but never switched off
    kinds = {(s.signature.kind.value, s.signature.detail) for s in out.report.slips}
    assert kinds == {("RAISED", "ValueError"), ("NONFINITE", "")}
    assert all(len(s.digest) == 16 for s in out.report.slips)


def test_the_run_budget_is_respected() -> None:
    ex = FakeExecutor(second_prefix_at_least_20)
    out = shrink(BIG, wrong(), ex, budget=ShrinkBudget(max_runs=6, max_seconds=600))
    assert len(ex.calls) == out.report.runs == 6
    assert out.report.exhausted is True
    assert second_prefix_at_least_20(out.case).outcome is Outcome.WRONG
    assert out.report.shrunk_size < out.report.original_size


def test_unsupported_candidates_are_rejected_without_a_run() -> None:
    def supports(case: Case, device: torch.device) -> str | None:
        return "needs head_dim >= 64" if case.attention.head_dim < 64 else None

    ex = FakeExecutor(second_prefix_at_least_20, supports)
    out = shrink(BIG, wrong(), ex)
    assert out.case.attention.head_dim == 64
    assert out.report.rejected_unsupported >= 2
    assert all(case.attention.head_dim >= 64 for case, _ in ex.calls)


def test_a_nondeterministic_finding_is_rerun_with_the_determinism_check() -> None:
    flaky = PathResult(path="fake", outcome=Outcome.NONDETERMINISTIC, reason="differs")
    ex = FakeExecutor(lambda case: flaky if len(case.batch.prefix_lens) > 1 else AGREE)
    out = shrink(BIG, flaky, ex)
    assert len(out.case.batch.prefix_lens) == 2
    assert ex.calls and all(check for _, check in ex.calls)


def test_search_down_finds_the_smallest_failing_value_in_log_runs() -> None:
    tried: list[int] = []

    def probe(candidate: Case) -> bool:
        p = candidate.batch.prefix_lens[0]
        tried.append(p)
        return p >= 37

    def setter(case: Case, value: int) -> Case:
        return case.replace(batch=BatchSpec(mode="target_verify", prefix_lens=(value,), q_len=2))

    start = setter(SIMPLEST, 1000)
    out = search_down(start, probe, 1000, 0, setter)
    assert out.batch.prefix_lens == (37,)
    assert tried[0] == 0 and len(tried) <= 2 + 10 + 1


def test_search_down_steps_below_a_non_monotone_binary_search_result() -> None:
    failing = {3, 4, 6, 8, 9, 10}

    def setter(case: Case, value: int) -> Case:
        return case.replace(batch=BatchSpec(mode="target_verify", prefix_lens=(value,), q_len=2))

    def probe(candidate: Case) -> bool:
        return candidate.batch.prefix_lens[0] in failing

    out = search_down(setter(SIMPLEST, 10), probe, 10, 0, setter)
    # binary search: 5 no, 7 no, 8 yes; then 7 (no) stops the single steps
    assert out.batch.prefix_lens == (8,)


def test_build_turns_an_invalid_candidate_into_none() -> None:
    shared = BIG.replace(batch=BatchSpec(mode="target_verify", prefix_lens=(70, 25), q_len=2))
    assert build(lambda: shared.replace(pool=PoolSpec(shared_prefix_pages=3))) is None
    assert build(lambda: shared) is shared


def test_only_the_finding_path_runs_and_the_session_clock_ends_the_shrink() -> None:
    ex = FakeExecutor(second_prefix_at_least_20)
    shrink(BIG, wrong(), ex)
    assert set(ex.only) == {("fake",)}  # never the other paths of the executor
    spent = FakeExecutor(second_prefix_at_least_20)
    spent.stop_at = 0.0  # the command's budget ended long ago
    out = shrink(BIG, wrong(), spent)
    # the original's rerun, then nothing: every candidate would wait past the budget
    assert out.report.exhausted is True and out.report.runs == 1
    assert out.case == BIG


def _raising(batch: Batch) -> torch.Tensor:
    raise torch.AcceleratorError("bad")


def _bad_shape(batch: Batch) -> torch.Tensor:
    return torch.zeros(2, 3)


def test_signatures_separate_failures_of_one_kind() -> None:
    # The detail comes from where the verdict is made, never from its reason text.
    case = SIMPLEST
    batch = materialize(case, "cpu")
    ref = reference(batch)
    bound = torch.full((batch.batch_size,), 1e-3, dtype=torch.float64)
    off = batch.new_output().copy_(ref + 1.0)
    holes = off.clone()
    holes[0] = float("nan")
    _, raised = run_path(KernelPath(name="fake", run=_raising), batch)
    _, shaped = run_path(KernelPath(name="fake", run=_bad_shape), batch)
    expected = [
        (judge("fake", batch, off, ref, bound), Outcome.WRONG, "tolerance"),
        (judge("fake", batch, holes, ref, bound), Outcome.WRONG, "unwritten"),
        (raised, Outcome.RAISED, "AcceleratorError"),
        (shaped, Outcome.RAISED, "bad-shape"),
        (PathResult(path="fake", outcome=Outcome.HANG, reason="deadline 30s"), Outcome.HANG, ""),
    ]
    for result, kind, detail in expected:
        signature = signature_of(result)
        assert signature == Signature(path="fake", kind=kind, detail=detail), result.reason
        assert Signature.from_json(Reader(signature.to_json(), "t", "sig")) == signature
    # A reason that looks like another exception does not change the identity.
    renamed = dataclasses.replace(raised, reason="ValueError: something else")
    assert signature_of(renamed).detail == "AcceleratorError"


def test_tree_drafts_shrink_to_a_prefix_of_their_parents() -> None:
    def rule(case: Case) -> PathResult:
        draft = case.batch.draft
        return wrong() if isinstance(draft, TreeDraft) and case.batch.q_len >= 4 else AGREE

    out = shrink(BIG, wrong(), FakeExecutor(rule))
    assert out.case.batch.draft == TreeDraft(parents=(-1, 0, 0, 1))
    assert out.case.batch.q_len == 4
    assert CausalDraft() != out.case.batch.draft


def test_a_request_is_traded_for_pages_elsewhere() -> None:
    """A failure a second request causes only by pushing the first one's pages off physical
    page 0 (a page table one page short) shrinks to one request with its pages elsewhere:
    dropping a request alone passes, dropping it with the pages moved still fails."""

    def rule(case: Case) -> PathResult:
        elsewhere = case.pool.page_order == "reversed" and case.pool.spare_pages >= 1
        return wrong() if case.batch.num_requests >= 2 or elsewhere else AGREE

    two = SIMPLEST.replace(batch=dataclasses.replace(SIMPLEST.batch, prefix_lens=(0, 0)))
    out = shrink(two, wrong(), FakeExecutor(rule), budget=ShrinkBudget(max_runs=200))
    assert out.case.batch.prefix_lens == (0,)
    assert (out.case.pool.page_order, out.case.pool.spare_pages) == ("reversed", 1)
    assert out.report.passes.get("trade_request") == 1
    assert out.case.size() < two.size()
