"""The fused float64 oracle agrees with the torch form on the GPU: its first-use check passes
here, and on the stored cases of ``tests/data/verdicts.json`` and on cases drawn at the default
GPU limits (tens of thousands of keys, requests cut in many items, every stored dtype the
generators reach) the two give the same output within float64 rounding, NaN where NaN; so
does the float64 oracle's one pass (``fused.ONE_PASS``). The
noise floors' float32 roundings pass their own check, are as near the torch form's on the same
cases as that check allows, and a request's floors in a packed launch are its floors alone,
bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import _floors
import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import GPU_LIMITS, cases
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.oracle import fused
from difftest.oracle.batched import Rounding, batched_paged_attention

DATA = Path(__file__).parents[1] / "data"

pytestmark = pytest.mark.skipif(
    not fused._have_triton(), reason="Triton is not installed: nothing fused to test"
)


@pytest.fixture(autouse=True)
def floors_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 kernels tested here whatever the default (``fused.FLOORS_ENABLED``: off
    until a campaign measures them against the torch form)."""
    monkeypatch.setattr(fused, "FLOORS_ENABLED", True)


@pytest.fixture(params=["two-passes", "one-pass"])
def passes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both forms of the float64 oracle (:data:`fused.ONE_PASS`: one pass by default, the
    two passes on ``DIFFTEST_FUSED_ONE_PASS=0``)."""
    one = request.param == "one-pass"
    monkeypatch.setattr(fused, "ONE_PASS", one)
    return one


def test_the_first_use_check_passes_here(passes: bool) -> None:
    assert fused._agrees(torch.device("cuda"))
    assert fused.checked(torch.device("cuda"))
    assert fused.usable(torch.device("cuda"))


def test_the_floors_first_use_check_passes_here() -> None:
    for p_dtype in fused.P_FORMATS:
        print(f"{p_dtype}: past its largest -> {fused.overflow(p_dtype, 'cuda')}")
        assert fused.overflow(p_dtype, "cuda") is not None
    assert fused._floors_agree(torch.device("cuda"))
    assert fused.floors_checked(torch.device("cuda"))
    assert fused.floors_usable(torch.device("cuda"))


def _both(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    args, kwargs = _floors.launch(batch)
    (got,) = fused.batched_attention(*args, [Rounding(batch.q)], use_fused=True, **kwargs)
    (want,) = batched_paged_attention(*args, [Rounding(batch.q)], **kwargs)
    return got, want


def _check(batches: list[Batch]) -> None:
    worst = 0.0
    for n, batch in enumerate(batches):
        got, want = _both(batch)
        assert torch.equal(got.isnan(), want.isnan()), n
        scale = float(want.nan_to_num().abs().max()) if want.numel() else 1.0
        err = float((got - want).nan_to_num().abs().max()) if want.numel() else 0.0
        assert err <= 1e-12 * max(scale, 1e-300), (n, err, scale)
        worst = max(worst, err / max(scale, 1e-300))
    print(f"{len(batches)} launches, worst relative difference {worst:.3g}")


def test_the_stored_cases_agree_within_rounding(passes: bool) -> None:
    stored = json.loads((DATA / "verdicts.json").read_text())["cases"]
    _check([materialize(Case.from_json(e["case"]), "cuda") for e in stored])


def test_cases_at_the_default_gpu_limits_agree_within_rounding(passes: bool) -> None:
    drawn = sample_cases(cases(limits=GPU_LIMITS), seed=2512, count=12)
    batches = [materialize(c, "cuda") for c in drawn]
    assert max(int(b.seq_lens.max()) for b in batches) > 4 * fused.KEYS_PER_ITEM
    _check(batches)


def _floors_check(batches: list[Batch]) -> None:
    """Each request's floors from the kernels within :data:`_floors.FLOOR_RATIO` of the
    torch form's, as the framework takes them; and the first and last request of each
    launch alone given the same bits as in the launch."""
    worst = 1.0
    for n, batch in enumerate(batches):
        ratio = _floors.worst_ratio(batch)
        assert ratio <= _floors.FLOOR_RATIO, (n, ratio)
        worst = max(worst, ratio)
        if batch.batch_size < 2 or batch.is_ragged:
            continue
        _, together = _floors.outputs(batch, fused_form=True)
        roundings = fused.floor_roundings(batch.q)
        rows = batch.q_len
        for b in (0, batch.batch_size - 1):
            one = slice(b * rows, (b + 1) * rows)
            alone = fused.batched_attention(
                batch.k_pages,
                batch.v_pages,
                batch.block_tables[b : b + 1],
                batch.seq_lens[b : b + 1],
                rows,
                [Rounding(r.q[one], r.compute_dtype, r.p_dtype) for r in roundings],
                bmm1_scale=batch.bmm1_scale,
                bmm2_scale=batch.bmm2_scale,
                window_left=batch.window_left,
                sinks=batch.sinks,
                draft_mask=None if batch.is_chain_draft else batch.draft_mask,  # one [L, L]
                use_fused=True,
            )
            for whole, single in zip(together, alone, strict=True):
                assert torch.equal(whole[one].view(torch.int32), single.view(torch.int32)), n
    print(f"{len(batches)} launches, floors at most {worst:.3g}x apart")


def test_the_stored_cases_floors_are_the_torch_forms() -> None:
    stored = json.loads((DATA / "verdicts.json").read_text())["cases"]
    _floors_check([materialize(Case.from_json(e["case"]), "cuda") for e in stored])


def test_floors_at_the_default_gpu_limits_are_the_torch_forms() -> None:
    drawn = sample_cases(cases(limits=GPU_LIMITS), seed=2512, count=12)
    _floors_check([materialize(c, "cuda") for c in drawn])


def test_lanes_give_each_row_the_bits_of_a_program_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one pass's lanes (``online_lanes``: several (item, KV head) pairs a program where
    a KV head has at most 8 rows) give the values of one pair a program (``online``), on the
    stored cases and on cases drawn at the default GPU limits whose KV heads have few
    rows."""
    monkeypatch.setattr(fused, "ONE_PASS", True)
    stored = json.loads((DATA / "verdicts.json").read_text())["cases"]
    drawn = [Case.from_json(e["case"]) for e in stored]
    drawn += [
        c
        for c in sample_cases(cases(limits=GPU_LIMITS), seed=2513, count=60)
        if c.batch.q_len * c.attention.num_qo_heads <= 8 * c.attention.num_kv_heads
    ][:12]
    made: list[int] = []
    plan = fused.plan

    def noted(*a: object, **kw: object) -> fused.Launch:
        launch = plan(*a, **kw)  # type: ignore[arg-type]
        made.append(launch.lanes)
        return launch

    monkeypatch.setattr(fused, "plan", noted)
    for n, case in enumerate(drawn):
        batch = materialize(case, "cuda")
        args, kwargs = _floors.launch(batch)
        outs = []
        for on in (True, False):
            monkeypatch.setattr(fused, "LANES_ENABLED", on)
            (out,) = fused.batched_attention(*args, [Rounding(batch.q)], use_fused=True, **kwargs)
            outs.append(out)
        a, b = outs
        assert torch.equal(a.isnan(), b.isnan()), n
        assert torch.equal(a.nan_to_num(), b.nan_to_num()), n
    print(f"{len(drawn)} cases, lanes a program: {sorted(set(made))}")
    assert {2, 4, 8} <= set(made), made
