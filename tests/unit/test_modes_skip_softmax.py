"""Skip-softmax (issue 18): the bound on what skipping may change, against the CPU reference
of the skipping, and the verdicts of paths that honour or ignore the factor.

The reference (:func:`difftest.oracle.skip_softmax.skipping_attention`) skips KV tiles by the
FMHAv2 rule; the bound (:func:`~difftest.oracle.skip_softmax.skip_allowance`, derived in
``docs/semantics.md``) must hold for every tile size and factor, and must be reached in part
(a bound far above any skipping would hide a kernel that skips too much). The planted kernel
that skips more than the threshold allows must be found.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest
import torch
from _planted import planted_modes_fixture  # noqa: F401  (fixture)

from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.judgement import skip_softmax as skip_verdicts
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
from difftest.oracle.attention import attention_terms, paged_attention_reference
from difftest.oracle.skip_softmax import skip_allowance, skipping_attention, thresholds
from difftest.paths import get_path
from difftest.paths.modes import PathModes

CPU = torch.device("cpu")


def skip_case(
    factor: float | None,
    *,
    prefixes: tuple[int, ...] = (70, 130),
    L: int = 3,
    family: str = "outlier_tokens",
    window_left: int = -1,
    sinks: bool = False,
    draft: CausalDraft | TreeDraft | None = None,
    q_lens: tuple[int, ...] | None = None,
    seed: int = 5,
) -> Case:
    return Case(
        attention=AttentionConfig(
            num_qo_heads=4,
            num_kv_heads=2,
            head_dim=32,
            page_size=16,
            window_left=window_left,
            sinks=sinks,
            skip_softmax_threshold_scale_factor=factor,
        ),
        batch=BatchSpec(
            mode="target_verify",
            prefix_lens=prefixes,
            q_len=L,
            draft=draft or CausalDraft(),
            q_lens=q_lens,
        ),
        pool=PoolSpec(page_order="shuffled"),
        values=ValueSpec(family=family, scale=2.0),  # type: ignore[arg-type]
        seed=seed,
    )


def _reference_and_bound(case: Case, tile: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(exact - skipping) per element, the allowance per request, the share skipped."""
    batch = materialize(case, CPU)
    factor = case.attention.skip_softmax_threshold_scale_factor
    assert factor is not None
    common = {
        "bmm1_scale": batch.bmm1_scale,
        "window_left": batch.window_left,
        "draft_mask": None if batch.is_chain_draft else batch.draft_mask,
        "q_lens": batch.new_tokens() if batch.is_ragged else None,
    }
    args = (batch.q, batch.k_pages, batch.v_pages, batch.block_tables, batch.seq_lens)
    exact = paged_attention_reference(
        *args, batch.q_len, bmm2_scale=batch.bmm2_scale, sinks=batch.sinks, **common
    )
    skipped, share = skipping_attention(
        *args,
        batch.q_len,
        factor=factor,
        tile_tokens=tile,
        bmm2_scale=batch.bmm2_scale,
        sinks=batch.sinks,
        **common,
    )
    terms = attention_terms(*args, batch.q_len, **common)
    bound = skip_allowance(terms, factor, batch.bmm2_scale, batch.sinks is not None)
    err = (skipped - exact).abs().amax(dim=(1, 2))  # [R]
    per_request = torch.zeros_like(bound)
    per_request.scatter_reduce_(0, batch.row_requests(), err, "amax")
    return per_request, bound, share


VARIANTS = {
    "chain": {},
    "window": {"window_left": 40},
    "sinks": {"sinks": True},
    "tree": {"draft": TreeDraft(parents=(-1, 0, 0))},
    "ragged": {"q_lens": (3, 1)},
    "large-logits": {"family": "large_logits"},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("tile", [16, 64, 128])
def test_skipping_by_the_rule_stays_within_the_bound(name: str, tile: int) -> None:
    worst_ratio = 0.0
    skipped_any = False
    for factor in (0.01, 0.3, 1.0, 4.0):
        for seed in range(3):
            case = skip_case(factor, seed=seed, **VARIANTS[name])  # type: ignore[arg-type]
            err, bound, share = _reference_and_bound(case, tile)
            assert bool((err <= bound + 1e-12).all()), (factor, seed, err, bound)
            skipped_any |= share > 0
            if share > 0:
                worst_ratio = max(worst_ratio, float((err / bound.clamp_min(1e-300)).max()))
    assert skipped_any, "no tile was skipped: the bound was not put to the test"
    # The bound is not vacuous: skipping uses a visible part of it somewhere.
    assert worst_ratio > 1e-3, worst_ratio


def test_a_zero_factor_skips_nothing_and_is_exact_attention() -> None:
    case = skip_case(None)  # a case cannot set 0 (the kernels read it as off: leave it unset)
    batch = materialize(case, CPU)
    args = (batch.q, batch.k_pages, batch.v_pages, batch.block_tables, batch.seq_lens, 3)
    kw = {"bmm1_scale": batch.bmm1_scale, "bmm2_scale": batch.bmm2_scale}
    out, share = skipping_attention(*args, factor=0.0, tile_tokens=16, **kw)
    assert share == 0.0
    torch.testing.assert_close(out, paged_attention_reference(*args, **kw), rtol=1e-12, atol=1e-12)
    terms = attention_terms(*args, bmm1_scale=batch.bmm1_scale)
    assert float(skip_allowance(terms, 0.0, batch.bmm2_scale, False).max()) == 0.0


def test_the_threshold_is_the_factor_over_each_request_kv_length() -> None:
    assert thresholds(0.5, torch.tensor([1, 10, 250])).tolist() == [0.5, 0.05, 0.002]


def test_a_path_that_skips_by_the_rule_agrees_and_says_how_much_room_it_took(
    planted_modes: ModuleType,
) -> None:
    path = get_path(planted_modes.SKIP_REFERENCE)
    used = 0
    for family in ("randn", "large_logits"):
        for seed in range(3):
            case = skip_case(4.0, seed=seed, prefixes=(150, 90), family=family)
            [result] = evaluate(case, [path], CPU).results
            assert result.outcome is Outcome.AGREE, result.reason
            assert result.metrics.skip_allowance is not None
            assert result.metrics.beyond_exact is not None
            used += result.metrics.beyond_exact
    assert used > 0, "skipping never needed the allowance: the test shows nothing"


def test_a_kernel_that_skips_more_than_the_threshold_allows_is_found(
    planted_modes: ModuleType,
) -> None:
    path = get_path(planted_modes.SKIP_TIMES_LENGTH)
    outcomes = []
    for seed in range(4):
        case = skip_case(0.01, seed=seed, prefixes=(150, 90))
        [result] = evaluate(case, [path], CPU).results
        outcomes.append(result.outcome)
    assert Outcome.WRONG in outcomes, outcomes
    # and without the factor it is exact attention (the bug is the skipping)
    [plain] = evaluate(skip_case(None, prefixes=(150, 90)), [path], CPU).results
    assert plain.outcome is Outcome.AGREE


def test_a_path_that_ignores_the_factor_is_reported_ignores_with_the_argument() -> None:
    case = skip_case(0.3)
    result = evaluate(case, [get_path("torch-sdpa"), get_path("torch-paged-online")], CPU)
    for r in result.results:
        assert r.outcome is Outcome.IGNORES, r
        assert r.detail == skip_verdicts.ARGUMENT
        assert "skip_softmax_threshold_scale_factor=0.3 had no effect" in r.reason
        assert not r.outcome.is_finding
    # without the factor, the same paths are plain AGREE
    plain = evaluate(skip_case(None), [get_path("torch-sdpa")], CPU).results[0]
    assert plain.outcome is Outcome.AGREE


def test_an_ignoring_path_is_held_to_exact_attention(planted_modes: ModuleType) -> None:
    # The rule-skipping kernel declared as ignoring the factor: its skipping is then an error
    # beyond the exact tolerance on some case (the allowance is not given to it).
    honest = get_path(planted_modes.SKIP_REFERENCE)
    pretends = dataclasses.replace(honest, name="skips-says-ignores", modes=PathModes())
    outcomes = []
    for seed in range(3):
        case = skip_case(4.0, seed=seed, prefixes=(150, 90), family="randn")
        outcomes.append(evaluate(case, [pretends], CPU).results[0].outcome)
    assert Outcome.WRONG in outcomes, outcomes
