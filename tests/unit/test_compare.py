"""The comparison: per-request verdicts against a measured noise floor."""

from __future__ import annotations

import math

import pytest
import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.generation.materialize import materialize
from difftest.generation.strategies import LIMITS
from difftest.judgement import tolerance as compare
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome
from difftest.paths.registry import Precision


def batch_of(prefixes: tuple[int, ...] = (20, 7, 33)) -> compare.Batch:
    case = Case(
        attention=AttentionConfig(num_qo_heads=4, num_kv_heads=1, head_dim=32, page_size=8),
        batch=BatchSpec(mode="target_verify", prefix_lens=prefixes, q_len=4),
        seed=5,
    )
    return materialize(case)


def bounds(batch: compare.Batch, ref: torch.Tensor, p_dtype: str = "bf16") -> torch.Tensor:
    floor = compare.noise_floor(batch, ref, Precision(p_dtype=p_dtype))  # type: ignore[arg-type]
    return compare.request_bounds(batch, ref, floor, compare.Tolerance())


def test_floor_is_positive_and_small() -> None:
    b = batch_of()
    ref = compare.reference(b)
    floor = compare.noise_floor(b, ref, Precision(p_dtype="bf16"))
    assert floor.shape == (3,)
    assert (floor > 0).all()
    assert (floor < 0.05 * ref.abs().max()).all()
    fp32 = compare.noise_floor(b, ref, Precision(p_dtype="fp32"))
    assert (fp32 <= floor).all()  # rounding P adds error


def test_rounded_reference_passes_and_a_one_request_error_fails_only_that_request() -> None:
    b = batch_of()
    ref = compare.reference(b)
    bound = bounds(b, ref)
    good = ref.to(torch.bfloat16)
    assert compare.judge("p", b, good, ref, bound).outcome is Outcome.AGREE
    bad = good.clone()
    bad[4 + 2, 3, 7] += 8 * float(bound[1])  # request 1, row 2, head 3
    verdict = compare.judge("p", b, bad, ref, bound)
    assert verdict.outcome is Outcome.WRONG
    errors = verdict.metrics.errors
    assert [e.request for e in errors] == [1]
    assert errors[0].rows == (2,) and errors[0].heads == (3,)
    assert verdict.metrics.mismatch_fraction == 1 / bad.numel()
    assert verdict.detail == "tolerance"
    assert "1 of 3 requests" in verdict.reason


def test_error_just_over_the_bound_fails_and_just_under_passes() -> None:
    b = batch_of()
    ref = compare.reference(b)
    bound = bounds(b, ref)
    out = ref.clone()
    out[0, 0, 0] += float(bound[0]) * 0.99
    assert compare.judge("p", b, out, ref, bound).outcome is Outcome.AGREE
    out[0, 0, 0] = ref[0, 0, 0] + float(bound[0]) * 1.01
    assert compare.judge("p", b, out, ref, bound).outcome is Outcome.WRONG


def test_unwritten_rows_and_nonfinite() -> None:
    b = batch_of()
    ref = compare.reference(b)
    bound = bounds(b, ref)
    out = b.new_output()
    out[:8] = ref[:8].to(out.dtype)
    verdict = compare.judge("p", b, out, ref, bound)
    assert verdict.outcome is Outcome.WRONG
    assert verdict.metrics.unwritten_rows == 4 and verdict.detail == "unwritten"
    assert "never written" in verdict.reason
    out = ref.to(torch.bfloat16).clone()
    out[3, 1, 2] = float("inf")
    verdict = compare.judge("p", b, out, ref, bound)
    assert verdict.outcome is Outcome.NONFINITE and verdict.metrics.nonfinite == 1


def test_pair_agreement_names_the_requests() -> None:
    b = batch_of()
    ref = compare.reference(b)
    bound = bounds(b, ref)
    x = ref.clone()
    y = ref.clone()
    y[8:12] += 1.0
    pair = compare.pair_agreement("a", "b", x, y, bound, bound, 3)
    assert not pair.agree and pair.bad_requests == (2,)
    assert compare.pair_agreement("a", "b", x, x, bound, bound, 3).agree


def test_fp8_q_precision_widens_the_floor() -> None:
    b = batch_of()
    ref = compare.reference(b)
    wide = compare.noise_floor(b, ref, Precision(p_dtype="bf16", q_dtype="fp8_e4m3"))
    narrow = compare.noise_floor(b, ref, Precision(p_dtype="bf16"))
    assert (wide > narrow).all()


def test_precisions_computed_together_are_each_computed_alone() -> None:
    """The oracle shares one score matrix between precisions that read the same queries (and
    one rounded copy of q between those that round it alike): what each precision gets is
    bit for bit what it gets alone."""
    b = batch_of()
    wanted = [
        Precision(p_dtype="bf16"),
        Precision(p_dtype="fp32"),
        Precision(p_dtype="bf16", q_dtype="fp8_e4m3"),
        Precision(p_dtype="fp32", q_dtype="fp8_e4m3"),
    ]
    ref, together = compare.oracle_outputs(b, wanted)
    assert torch.equal(ref, compare.reference(b))
    for precision in wanted:
        _, alone = compare.oracle_outputs(b, [precision])
        assert torch.equal(together[precision], alone[precision])


def test_bounds_with_the_absolute_allowance_given_are_the_bounds() -> None:
    b = batch_of()
    ref = compare.reference(b)
    tol = compare.Tolerance()
    floor = compare.noise_floor(b, ref, Precision())
    absolute = compare.absolute_allowance(b, ref, tol)
    assert bool((absolute > 0).all())
    given = compare.request_bounds(b, ref, floor, tol, absolute)
    assert torch.equal(given, compare.request_bounds(b, ref, floor, tol))
    assert torch.equal(given, tol.rtol * floor + absolute)


def test_judging_by_row_maxima_gives_what_every_element_gives() -> None:
    """The judgement settles the common case on each row's largest error and looks at every
    element only when a row is over its bound: the metrics are those of the element-wise
    reading (max error, mismatch fraction, located rows and heads), and a NaN or inf in a row
    is never hidden by the row maximum."""
    b = batch_of()
    ref = compare.reference(b)
    bound = bounds(b, ref)
    out = ref.to(torch.bfloat16).double()
    good = compare.judge("p", b, out, ref, bound)
    assert good.outcome is Outcome.AGREE and good.metrics.mismatch_fraction == 0.0
    assert good.metrics.max_abs == float((out - ref).abs().max())
    over = out.clone()
    over[0, 1, 2] += 4 * float(bound[0])
    over[9, 0, 5] += 4 * float(bound[2])
    over[9, 2, 1] += 4 * float(bound[2])
    wrong = compare.judge("p", b, over, ref, bound)
    err = (over - ref).abs()
    assert wrong.outcome is Outcome.WRONG and wrong.metrics.max_abs == float(err.max())
    assert wrong.metrics.mismatch_fraction == 3 / over.numel()
    assert {(e.request, e.rows, e.heads) for e in wrong.metrics.errors} == {
        (0, (0,), (1,)),
        (2, (1,), (0, 2)),
    }
    for poison in (float("nan"), float("-inf")):
        bad = out.clone()
        bad[5, 3, 0] = poison
        verdict = compare.judge("p", b, bad, ref, bound)
        assert verdict.outcome is Outcome.NONFINITE and verdict.metrics.nonfinite == 1
        finite = (bad - ref).abs().nan_to_num(nan=0.0, posinf=0.0)
        assert verdict.metrics.max_abs == float(finite.max())  # over the finite errors
        assert [e.request for e in verdict.metrics.errors] == [1]  # row 5: request 1


def _launch_of_parts() -> list[tuple[compare.Batch, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Three cases of other shapes (3, 1 and 2 requests), each with its oracle output, its
    bound and the bound's floor-free part (the absolute allowance)."""
    cases = []
    for prefixes in ((20, 7, 33), (5,), (40, 2)):
        b = batch_of(prefixes)
        ref = compare.reference(b)
        within = compare.absolute_allowance(b, ref, compare.Tolerance())
        cases.append((b, ref, bounds(b, ref), within))
    return cases


def _off(ref: torch.Tensor, error: float | torch.Tensor, row: int | None = None) -> torch.Tensor:
    """``ref`` with ``error`` added to one row (``None``: to every row; ``error`` ``[R]``:
    per row), in float64, so the error is exactly what is added."""
    out = ref.clone()
    if isinstance(error, torch.Tensor):
        return out + error.view(-1, 1, 1)
    if row is None:
        return out + error
    out[row] += error
    return out


def _agreeing(cases, outs):  # type: ignore[no-untyped-def]
    parts = [
        compare.Part(out, r, b.case.batch.new_tokens(), bd, w)
        for (b, r, bd, w), out in zip(cases, outs, strict=True)
    ]
    return compare.agreeing("p", parts)


def test_cases_judged_together_agree_where_each_judged_alone_agrees() -> None:
    cases = _launch_of_parts()
    assert all(bool((bd > w).all()) for _, _, bd, w in cases)  # the floor widens each bound
    over = 4 * max(float(bd.max()) for _, _, bd, _ in cases)
    midway = [(bd + w)[b.row_requests()] / 2 for b, _, bd, w in cases]
    variants = {
        "exact": [_off(r, 0.0) for _, r, _, _ in cases],
        "one case over": [
            _off(r, over if i == 2 else 0.0, 1) for i, (_, r, _, _) in enumerate(cases)
        ],
        "a NaN row": [
            _off(r, math.nan if i == 0 else 0.0, 2) for i, (_, r, _, _) in enumerate(cases)
        ],
        "an inf": [_off(r, math.inf if i == 1 else 0.0, 0) for i, (_, r, _, _) in enumerate(cases)],
        "past the allowance, within the bound": [
            _off(r, midway[i]) for i, (_, r, _, _) in enumerate(cases)
        ],
    }
    agreed = {}
    for name, outs in variants.items():
        fast = _agreeing(cases, outs)
        agreed[name] = [q is not None for q in fast]
        for (b, r, bd, w), mine, quick in zip(cases, outs, fast, strict=True):
            alone = compare.judge("p", b, mine, r, bd, w)
            if alone.outcome is not Outcome.AGREE:
                assert quick is None, name
                continue
            assert quick is not None and quick.outcome is Outcome.AGREE, name
            assert quick.reason == alone.reason == "" and quick.detail == alone.detail == ""
            q, a = quick.metrics, alone.metrics
            exact = ("max_abs", "mismatch_fraction", "nonfinite", "unwritten_rows", "max_bound")
            for field in exact:  # maxima, counts and bounds: bit for bit
                assert getattr(q, field) == getattr(a, field), (name, field)
            assert q.errors == a.errors == ()
            # the sums, taken over the launch in another order: within float64 rounding
            assert q.rel_l2 == pytest.approx(a.rel_l2, rel=1e-12, abs=1e-300), name
            if a.scale_ratio is None:
                assert q.scale_ratio is None, name
            else:
                assert q.scale_ratio == pytest.approx(a.scale_ratio, rel=1e-12), name
    # every branch is reached: all agree; one case out by error, NaN, inf; and agreements
    # decided against the floor-free part and against the whole bound
    assert agreed["exact"] == agreed["past the allowance, within the bound"] == [True] * 3
    assert agreed["one case over"] == [True, True, False]
    assert agreed["a NaN row"] == [False, True, True]
    assert agreed["an inf"] == [True, False, True]
    exact = _agreeing(cases, variants["exact"])
    past = _agreeing(cases, variants["past the allowance, within the bound"])
    for (_, _, bd, w), a, c in zip(cases, exact, past, strict=True):
        assert a is not None and a.metrics.max_bound == float(w.max())
        assert c is not None and c.metrics.max_bound == float(bd.max())


def _planned_launches(count: int) -> list[list[compare.Batch]]:
    """The first ``count`` launches of several cases a default CPU campaign plans (seed 4,
    packs of 4: other request counts, padding requests, the cache dtypes it draws), and each
    made ragged (request ``i`` with ``1 + i % L`` new tokens)."""
    config = CampaignConfig(seed=4, pack=4, cases_per_variant=4, limits=LIMITS["cpu"])
    planned = (c for _, c in planned_cases(config, "cpu"))
    launches = []
    for group in packing.group_for_launches(planned, 4):
        if len(group) > 1:
            launches.append([materialize(c) for c in group])
            ragged = []
            for c in group:
                prefixes, L = c.batch.prefix_lens, max(2, c.batch.q_len)
                q_lens = tuple(1 + i % L for i in range(len(prefixes)))
                ragged.append(
                    materialize(c.replace(batch=c.batch.with_real_requests(prefixes, q_lens)))
                )
            launches.append(ragged)
        if len(launches) >= count:
            return launches
    raise AssertionError("the planner ran out of launches")


def test_planned_launches_judged_together_agree_where_each_judged_alone_agrees() -> None:
    """On real launches, with each case's rows off by seeded multiples of its bound (some
    within the floor-free part, some past it, some over the bound, one NaN): the same verdict
    as each case judged alone, the same maxima, within float64 rounding the same sums."""
    gen = torch.Generator().manual_seed(11)
    seen = {"agree": 0, "left to judge": 0, "ragged": 0}
    for launch in _planned_launches(12):
        parts, alone = [], []
        for k, b in enumerate(launch):
            ref = compare.reference(b)
            within = compare.absolute_allowance(b, ref, compare.Tolerance())
            bound = bounds(b, ref)
            per_row = bound[b.row_requests()] * torch.rand(
                ref.shape[0], generator=gen, dtype=torch.float64
            )
            scale = (0.4, 0.9, 1.0, 3.0)[(k + len(seen)) % 4]
            out = ref + (scale * per_row).view(-1, 1, 1)
            if k == 3:
                out[0, 0, 0] = math.nan
            parts.append(compare.Part(out, ref, b.case.batch.new_tokens(), bound, within))
            alone.append(compare.judge("p", b, out, ref, bound, within))
            seen["ragged"] += b.is_ragged
        for quick, a in zip(compare.agreeing("p", parts), alone, strict=True):
            if a.outcome is not Outcome.AGREE:
                assert quick is None
                seen["left to judge"] += 1
                continue
            seen["agree"] += 1
            assert quick is not None and quick.outcome is Outcome.AGREE
            q, m = quick.metrics, a.metrics
            assert (q.max_abs, q.max_bound) == (m.max_abs, m.max_bound)
            assert q.rel_l2 == pytest.approx(m.rel_l2, rel=1e-12, abs=1e-300)
            assert q.scale_ratio == pytest.approx(m.scale_ratio, rel=1e-12)
    assert seen["agree"] >= 10 and seen["left to judge"] >= 10 and seen["ragged"] >= 10, seen


def test_pairs_of_a_launch_at_once_are_the_pairs_of_each_case_alone() -> None:
    cases = _launch_of_parts()
    big = 4 * max(float(bd.max()) for _, _, bd, _ in cases)
    for name, change in (
        ("the same outputs", lambda i, y: None),
        ("one request apart", lambda i, y: y[-1].add_(big) if i == 2 else None),
        ("a NaN on one side", lambda i, y: y[0].fill_(math.nan) if i == 0 else None),
        ("every case apart", lambda i, y: y.add_(big)),
    ):
        parts, alone = [], []
        for i, (b, ref, bd, w) in enumerate(cases):
            x, y = ref.clone(), ref.clone()
            change(i, y)
            parts.append(compare.PairPart(x, y, b.case.batch.new_tokens(), bd, w))
            alone.append(compare.pair_agreement("a", "b", x, y, bd, w, b.batch_size))
        together = compare.pair_agreements("a", "b", parts)
        assert together == alone, name
    assert [p.agree for p in together] == [False, False, False]
    assert together[0].bad_requests == (0, 1, 2)
    assert together[0].max_abs == pytest.approx(big, rel=1e-12)


def test_a_case_without_rows_is_left_to_judge() -> None:
    empty = compare.Part(
        torch.zeros(0, 2, 4),
        torch.zeros(0, 2, 4, dtype=torch.float64),
        (0,),
        torch.ones(1, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
    )
    (b, ref, bd, w), *_ = _launch_of_parts()
    found = compare.agreeing("p", [empty, compare.Part(ref, ref, b.case.batch.new_tokens(), bd, w)])
    assert found[0] is None and found[1] is not None and found[1].metrics.max_abs == 0.0
