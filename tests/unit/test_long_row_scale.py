"""The corpus entry ``xqa-fp8-long-row-scale``: XQA's Hopper fp8 kernel returns a row that sees
thousands of nearly equal keys scaled by about 0.98 (flashinfer 0.6.16.post4 and 0.7.4, H200;
docs/validation.md Runs 23 and 24). Before it was called a finding the oracle was checked, and
this test keeps the CPU half of that check on the entry's shrunk repro: the oracle's row agrees
with an independent float64 computation of it; the noise floor's model of a correct fp8 kernel
is the kernel written out (``ci/h200_long_row.py``) with one maximum per row; and correct fp8
kernels that round against running or partial maxima, or sum the rounded terms, stay within
one bf16 step of the row, far inside the bound XQA broke."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import Tolerance, floor_of, oracle_outputs, request_bounds
from difftest.model.batch import Batch
from difftest.paths.registry import Precision
from difftest.records.corpus import DEFAULT_CORPUS
from difftest.records.repro import load_repro

ROOT = Path(__file__).resolve().parents[2]
REPRO = DEFAULT_CORPUS / "xqa-fp8-long-row-scale.repro.json"
FP8 = Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
XQA_MAX_ERR = 0.009765625000000333
"""XQA's error on the row (request 1, row 4, head 6), from the shrink on the H200."""
BF16_STEP = 2.0**-9
"""The spacing of bf16 just below 0.5 in magnitude, where this row's largest values sit."""


def _probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("h200_long_row", ROOT / "ci" / "h200_long_row.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Row:
    """A corpus repro's wrongly computed row: the batch, the oracle and the noise floor's
    model at ``precision``, the row's bound, its keys and values, and where it is."""

    batch: Batch
    ref: torch.Tensor
    low: torch.Tensor
    bound: float
    k: torch.Tensor
    v: torch.Tensor
    g: int
    head: int
    located: tuple[int, int, int]
    max_abs: float


def _row(file: Path, precision: Precision) -> Row:
    """The row of ``file``'s first located error, after checking the oracle there against an
    independent float64 computation (the row's keys gathered from the pages, a plain
    softmax, times V)."""
    probe = _probe()
    repro = load_repro(file)
    [error] = repro.path_result().metrics.errors  # type: ignore[union-attr]
    request, row, head = error.request, error.rows[0], error.heads[0]
    batch = materialize(repro.case, "cpu")
    ref, lows = oracle_outputs(batch, (precision,))
    floor = floor_of(lows[precision], ref, batch)
    bound = float(request_bounds(batch, ref, floor, Tolerance())[request])
    g = request * repro.case.batch.q_len + row
    k, v = probe.row_keys(batch, request, row, head)
    q = batch.q[g, head].double()
    own = torch.softmax((k.double() @ q) * batch.bmm1_scale, dim=0) @ v.double()
    assert float((own * batch.bmm2_scale - ref[g, head]).abs().max()) < 1e-12
    return Row(
        batch, ref, lows[precision], bound, k, v, g, head, (request, row, head), error.max_abs
    )


def test_correct_fp8_kernels_stay_far_inside_the_bound_xqa_broke() -> None:
    probe = _probe()
    r = _row(REPRO, FP8)
    batch, ref, low_out, bound = r.batch, r.ref, r.low, r.bound
    k, v, g, head = r.k, r.v, r.g, r.head
    assert r.located == (1, 4, 6)
    assert r.max_abs == pytest.approx(XQA_MAX_ERR)
    assert XQA_MAX_ERR > bound
    assert k.shape[0] == 7302  # the prefix and the draft tokens up to this row

    s = (k @ batch.q[g, head].float().to(torch.float8_e4m3fn).float()) * batch.bmm1_scale

    def err(o: torch.Tensor) -> float:
        low = (o.double() * batch.bmm2_scale).to(batch.out_dtype).double()
        return float((low - ref[g, head]).abs().max())

    floor_model = float((low_out[g, head] - ref[g, head]).abs().max())
    assert err(probe.fp8_kernel(s, v, s.numel(), 1, False)) == pytest.approx(floor_model, abs=1e-12)
    variants = [
        err(probe.fp8_kernel(s, v, tile, parts, rounded))
        for rounded in (False, True)
        for tile, parts in [(16, 1), (64, 1), (256, 1), (64, 4), (64, 32), (64, 128)]
    ]
    # A correct kernel may land one bf16 step off where the row's values sit at -0.5 (its
    # float32 result a hair above the midpoint rounds to -0.498046875); XQA is five off.
    assert max(variants) <= BF16_STEP + 1e-15 < bound < XQA_MAX_ERR
    assert XQA_MAX_ERR == pytest.approx(5 * BF16_STEP, abs=1e-12)


SMALL_GROUP = DEFAULT_CORPUS / "xqa-fp8-long-row-small-group.repro.json"
XQA_SMALL_GROUP_ERR = 0.009765624999999944
"""XQA's error on ``xqa-fp8-long-row-small-group``'s row (request 6, row 0, head 1), from the
shrink on the H100 (docs/validation.md Run 39)."""


def test_the_small_group_entry_is_the_same_five_steps_and_correct_kernels_stay_in_one() -> None:
    """``xqa-fp8-long-row-small-group`` (a group of 2, L = 1, 12 requests: outside the first
    entry's trigger): the oracle's row agrees with an independent float64 one, the floor's
    model is the fp8 kernel written out with one maximum per row, correct fp8 kernels stay
    within one bf16 step, and XQA is five steps off, as on the first entry."""
    probe = _probe()
    r = _row(SMALL_GROUP, FP8)
    batch, ref, k, v, g, head = r.batch, r.ref, r.k, r.v, r.g, r.head
    assert r.located == (6, 0, 1)
    assert (batch.case.attention.num_qo_heads, batch.case.attention.num_kv_heads) == (2, 1)
    assert batch.case.batch.q_len == 1 and batch.case.batch.num_requests == 12
    assert r.max_abs == pytest.approx(XQA_SMALL_GROUP_ERR)
    assert k.shape[0] == 12619

    s = (k @ batch.q[g, head].float().to(torch.float8_e4m3fn).float()) * batch.bmm1_scale

    def err(o: torch.Tensor) -> float:
        low = (o.double() * batch.bmm2_scale).to(batch.out_dtype).double()
        return float((low - ref[g, head]).abs().max())

    floor_model = float((r.low[g, head] - ref[g, head]).abs().max())
    assert err(probe.fp8_kernel(s, v, s.numel(), 1, False)) == pytest.approx(floor_model, abs=1e-12)
    variants = [
        err(probe.fp8_kernel(s, v, tile, parts, rounded))
        for rounded in (False, True)
        for tile, parts in [(16, 1), (64, 1), (256, 1), (64, 4), (64, 32), (64, 128)]
    ]
    assert max(variants) <= BF16_STEP + 1e-15 < r.bound < XQA_SMALL_GROUP_ERR
    assert XQA_SMALL_GROUP_ERR == pytest.approx(5 * BF16_STEP, abs=1e-12)


def _bf16_models(probe: ModuleType, r: Row, s: torch.Tensor) -> tuple[float, list[float]]:
    """The noise floor's model's error on ``r``'s row, and the errors of correct bf16 kernels
    written out over its scores ``s`` (one maximum, online tiles of 16-256 keys, 4 or 128
    parts merged; the row sum over the rounded or the exact terms)."""
    batch, ref, g, head = r.batch, r.ref, r.g, r.head

    def err(o: torch.Tensor) -> float:
        low = (o.double() * batch.bmm2_scale).to(batch.out_dtype).double()
        return float((low - ref[g, head]).abs().max())

    floor_model = float((r.low[g, head] - ref[g, head]).abs().max())
    models = [
        err(probe.fp8_kernel(s, r.v, tile, parts, rounded, torch.bfloat16))
        for rounded in (False, True)
        for tile, parts in [(s.numel(), 1), (16, 1), (64, 1), (256, 1), (64, 4), (64, 128)]
    ]
    return floor_model, models


LARGE_LOGITS = DEFAULT_CORPUS / "xqa-bf16-large-logit-row.repro.json"
XQA_LARGE_LOGIT_ERR = 0.022513072700574455
"""XQA's error on the corpus entry ``xqa-bf16-large-logit-row`` (request 211, row 1, head 0)."""


def test_correct_bf16_kernels_stay_at_the_floor_where_xqa_broke_the_bound() -> None:
    """``xqa-bf16-large-logit-row``: the oracle's row agrees with an independent float64 one,
    and kernels written out at XQA's declared precision (float32 scores, probabilities
    rounded to bf16, every tiling and merge) all land on the noise floor's model, about a
    ninth of XQA's error."""
    probe = _probe()
    bf16 = Precision(p_dtype="bf16")
    r = _row(LARGE_LOGITS, bf16)
    batch, k, g, head = r.batch, r.k, r.g, r.head
    assert r.located == (211, 1, 0)
    assert r.max_abs == pytest.approx(XQA_LARGE_LOGIT_ERR)
    assert XQA_LARGE_LOGIT_ERR > r.bound

    s = (k @ batch.q[g, head].float()) * batch.bmm1_scale
    assert float(s.max()) > 30  # the large logits the trigger names
    floor_model, models = _bf16_models(probe, r, s)
    assert max(models) == pytest.approx(floor_model, abs=1e-12)
    assert 8 * max(models) < XQA_LARGE_LOGIT_ERR


LONG_RANDN = DEFAULT_CORPUS / "xqa-bf16-long-row-randn.repro.json"
XQA_LONG_RANDN_ERR = 0.04773731317651464
"""XQA's error on the corpus entry ``xqa-bf16-long-row-randn`` (request 94, row 1, head 0),
from its shrink on an H100 (docs/validation.md Run 43)."""


def test_the_randn_entry_is_the_oracle_right_and_correct_kernels_at_the_floor() -> None:
    """``xqa-bf16-long-row-randn``: the oracle's row (1,788 keys) agrees with an independent
    float64 one (inside :func:`_row`), and kernels written out at XQA's declared precision
    (float32 scores, probabilities rounded to bf16, every tiling and merge) all land on the
    noise floor's model, under a sixth of XQA's error, which is over the bound."""
    probe = _probe()
    r = _row(LONG_RANDN, Precision(p_dtype="bf16"))
    batch, k, g, head = r.batch, r.k, r.g, r.head
    assert r.located == (94, 1, 0)
    assert k.shape[0] == 1788
    assert r.max_abs == pytest.approx(XQA_LONG_RANDN_ERR)
    assert XQA_LONG_RANDN_ERR > r.bound

    s = (k @ batch.q[g, head].float()) * batch.bmm1_scale
    floor_model, models = _bf16_models(probe, r, s)
    assert max(models) == pytest.approx(floor_model, abs=1e-12)
    assert 6 * max(models) < XQA_LONG_RANDN_ERR


@pytest.mark.parametrize(
    ("repro", "xqa_err", "requests", "split", "passing_requests"),
    [
        (REPRO, XQA_MAX_ERR, 19, 5, 16),  # the ablation: more than 16 requests
        (SMALL_GROUP, XQA_SMALL_GROUP_ERR, 12, 8, 8),  # the ablation: more than 8
    ],
    ids=["long-row-scale", "small-group"],
)
def test_a_14_bit_accumulator_split_as_xqa_splits_gives_xqas_error_exactly(
    repro: Path, xqa_err: float, requests: int, split: int, passing_requests: int
) -> None:
    """The mechanism both fp8 entries point to, modelled on the CPU (docs/validation.md Run 39):
    XQA's SM90 fp8 kernel splits a row's keys between CTAs by the launch's request count,
    and if each CTA sums its products with V in an accumulator that keeps 14 bits (as Hopper's
    fp8 MMAs are measured to), the row comes out exactly as XQA's did (0.009765625 off on
    both entries), while with the ablation's passing request count (more CTAs, fewer keys
    each) it stays inside the bound, as the shrinker saw, and summed exactly it is one bf16
    step at most. A 13 or 16 bit accumulator gives other errors."""
    probe = _probe()
    r = _row(repro, FP8)
    batch, ref, k, v, g, head = r.batch, r.ref, r.k, r.v, r.g, r.head
    assert batch.case.batch.num_requests + batch.case.batch.padding_requests == requests
    s = (k @ batch.q[g, head].float().to(torch.float8_e4m3fn).float()) * batch.bmm1_scale

    def err(split: int, bits: int) -> float:
        o = probe.xqa_sm90_fp8_model(s, v, split, bits)
        low = (o * batch.bmm2_scale).to(batch.out_dtype).double()
        return float((low - ref[g, head]).abs().max())

    assert probe.xqa_sub_seqs(requests, s.numel()) == split
    assert err(split, 14) == pytest.approx(xqa_err, abs=1e-12)
    assert err(split, 13) > xqa_err and err(split, 16) < r.bound
    more_ctas = probe.xqa_sub_seqs(passing_requests, s.numel())
    assert more_ctas > split and err(more_ctas, 14) <= r.bound
    assert err(split, 0) <= BF16_STEP + 1e-15


def test_xqas_split_rounds_halves_away_from_zero_and_keeps_a_tile_a_cta() -> None:
    """``xqa_sub_seqs`` as ``mha_sm90.cu`` computes ``nbSubSeqPerSeq``: the integer division,
    times 0.25, rounded as C's ``round`` rounds (halves away from zero, where Python's
    ``round`` goes to even), at least one CTA, and no more CTAs than 64-key tiles."""
    probe = _probe()
    assert probe.xqa_sub_seqs(39, 10_000) == 3  # 396 // 39 = 10: 2.5 -> 3
    assert probe.xqa_sub_seqs(12, 20_000) == 8  # 33 * 0.25 = 8.25
    assert probe.xqa_sub_seqs(50, 20_000) == 2  # 7 * 0.25 = 1.75
    assert probe.xqa_sub_seqs(223, 20_000) == 1  # 1 * 0.25 = 0.25: at least one
    assert probe.xqa_sub_seqs(4, 100) == 2  # 25 CTAs asked, two tiles of keys
    assert probe.xqa_sub_seqs(6, 20_000, kv_heads=2) == 8  # 396 // 12 = 33


def test_a_request_sweep_keeps_the_rows_keys_and_the_model_grows_with_keys_a_cta() -> None:
    """``ci/h200_long_row.py --requests`` (the GPU sweep of docs/validation.md Run 40): the
    small-group entry's case with its request list cut or lengthened keeps the located row's
    keys and values; the model's error there grows as fewer CTAs share the row, and at the
    entry's own 12 requests it is XQA's error. Off a GPU the path is reported unavailable."""
    probe = _probe()
    repro = load_repro(SMALL_GROUP)
    [error] = repro.path_result().metrics.errors  # type: ignore[union-attr]
    rows = probe.sweep_requests(
        repro.case, [7, 12, 24, 67], error.request, error.rows[0], error.heads[0], "fi-decode-xqa"
    )
    assert [r["requests"] for r in rows] == [7, 12, 24, 67]
    assert [r["ctas_a_row"] for r in rows] == [14, 8, 4, 1]
    assert all(r["row_keys_as_first"] for r in rows)
    errs = [r["model_14_bits"] for r in rows]
    assert errs == sorted(errs) and errs[0] < BF16_STEP < errs[-1]
    assert errs[1] == pytest.approx(XQA_SMALL_GROUP_ERR, abs=1e-12)
    assert all(("path" in r) != ("path_unavailable" in r) for r in rows)  # run, or why not
    assert probe.with_requests(repro.case, 12) == repro.case


def test_a_sweep_lengthens_a_case_with_shared_pages_by_requests_that_hold_them() -> None:
    """The randn entry's launch shares a 32-token prefix page between its requests, so a
    request added by the sweep holds that page (a request without a prefix would make the case
    invalid); the located last request's keys stay as they were."""
    probe = _probe()
    repro = load_repro(LONG_RANDN)
    case = repro.case
    longer = probe.with_requests(case, 98)
    assert longer.batch.prefix_lens == (*case.batch.prefix_lens, 32, 32, 32)
    rows = probe.sweep_requests(case, [95, 98], 94, 1, 0, "fi-decode-xqa")
    assert [r["requests"] for r in rows] == [95, 98]
    assert all(r["row_keys_as_first"] for r in rows)
