"""The fused float64 oracle is pinned to the definition, and its float32 roundings (the noise
floors') to the torch form.

:mod:`difftest.oracle.fused` computes the float64 oracle and the noise floors' float32
roundings in Triton kernels on a GPU. Here the same kernels run under Triton's interpreter on
the CPU (``TRITON_INTERPRET=1``; skipped, with the reason, where Triton is not installed). The
float64 output is held to :func:`difftest.oracle.attention.paged_attention_reference` within
float64 rounding, over generated cases (every mask, window, sink, tree draft, GQA ratio and
storage the generators reach), ragged launches, requests long enough to be cut in several
items, stale slots holding NaN, and every fp8 and many bf16 bit patterns. The float32
roundings are held to the torch form (:func:`difftest.oracle.batched.batched_paged_attention`)
as the first-use check holds them (:func:`difftest.oracle.fused.floors_distance`), their
probability rounding bit for bit to torch's conversions over millions of float32 values, and
a request's floors in a launch bit for bit to its floors alone.
``tests/gpu/test_oracle_fused_gpu.py`` runs them on CUDA.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import _floors
import numpy as np
import pytest
import torch
from _interpreter import not_interpretable
from _paged import paginate, ragged_launch, random_case

import difftest.oracle
from difftest.execution import packing
from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import Limits, cases
from difftest.model.batch import Batch
from difftest.oracle import fused
from difftest.oracle.attention import paged_attention_reference
from difftest.oracle.batched import Rounding, batched_paged_attention
from difftest.oracle.fused import batched_attention

WHY_NOT = not_interpretable("the fused oracle's kernels")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

SMALL = Limits(max_work=200_000, typical_requests=4, typical_prefix=150, long_share=5)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The kernels built anew for this test, and dropped after it."""
    monkeypatch.delitem(sys.modules, "difftest.oracle.fused_kernels", raising=False)
    monkeypatch.delattr(difftest.oracle, "fused_kernels", raising=False)
    monkeypatch.setattr(fused, "_kernels", None)
    monkeypatch.setattr(fused, "_checked", None)
    monkeypatch.setattr(fused, "_floors_checked", None)
    monkeypatch.setattr(fused, "_lanes_checked", None)
    yield


@pytest.fixture(params=["two-passes", "one-pass"])
def passes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both forms of the float64 oracle: ``maxima`` then ``sums`` (the default), and
    ``online`` (:data:`fused.ONE_PASS`). ``True`` for the one pass."""
    one = request.param == "one-pass"
    monkeypatch.setattr(fused, "ONE_PASS", one)
    return one


def _kwargs(batch: Batch) -> dict[str, object]:
    return {
        "bmm1_scale": batch.bmm1_scale,
        "bmm2_scale": batch.bmm2_scale,
        "window_left": batch.window_left,
        "sinks": batch.sinks,
        "draft_mask": None if batch.is_chain_draft else batch.draft_mask,
    }


def _fused(batch: Batch, q: torch.Tensor | None = None) -> torch.Tensor:
    (out,) = batched_attention(
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.new_tokens() if batch.is_ragged else batch.q_len,
        [Rounding(batch.q if q is None else q)],
        use_fused=True,
        **_kwargs(batch),
    )
    return out


def _drawn() -> list[Batch]:
    generic = sample_cases(cases(limits=SMALL), seed=25, count=30)
    presets = [
        c
        for name in ("gpt-oss-120b", "llama-3.1-8b")
        for c in sample_cases(cases(preset=name, limits=SMALL), seed=26, count=6)
    ]
    return [materialize(c) for c in generic + presets]


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference relative to the output's magnitude (NaN where NaN)."""
    assert torch.equal(got.isnan(), want.isnan())
    scale = float(want.nan_to_num().abs().max()) if want.numel() else 1.0
    diff = (got - want).nan_to_num().abs()
    return float(diff.max()) / max(scale, 1e-300) if want.numel() else 0.0


def test_generated_cases_agree_with_the_definition_within_rounding(passes: bool) -> None:
    batches = _drawn()
    features = {
        "window": any(b.window_left >= 0 for b in batches),
        "sinks": any(b.sinks is not None for b in batches),
        "tree": any(not b.is_chain_draft for b in batches),
        "fp8": any(b.k_pages.dtype == torch.float8_e4m3fn for b in batches),
        "gqa": any(b.q.shape[1] > b.k_pages.shape[1] for b in batches),
    }
    assert all(features.values()), features
    for batch in batches:
        want = paged_attention_reference(
            batch.q,
            batch.k_pages,
            batch.v_pages,
            batch.block_tables,
            batch.seq_lens,
            batch.q_len,
            **_kwargs(batch),  # type: ignore[arg-type]
        )
        got = _fused(batch)
        assert got.dtype == torch.float64
        assert _close(got, want) <= 1e-12, batch


@pytest.mark.parametrize("seed", range(12))
def test_a_ragged_launch_is_each_request_alone(seed: int, passes: bool) -> None:
    launch = ragged_launch(seed)
    p = launch.paged
    (got,) = batched_attention(
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        launch.q_lens,
        [Rounding(launch.q)],
        draft_mask=launch.draft,
        use_fused=True,
        **launch.kwargs,
    )
    start = 0
    for b, n in enumerate(launch.q_lens):
        assert _close(got[start : start + n], launch.alone(b)) <= 1e-12, (b, n)
        start += n


def _pool(
    lengths: list[int], h_kv: int, d: int, page_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ks = [torch.randn(n, h_kv, d, generator=gen, dtype=torch.float64) for n in lengths]
    vs = [torch.randn(n, h_kv, d, generator=gen, dtype=torch.float64) for n in lengths]
    p = paginate(ks, vs, page_size)
    return p.k_pages, p.v_pages, p.block_tables


def _pool_with_nan(
    lengths: list[int], h_kv: int, d: int, spare: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_pool` (pages of 16) with ``spare`` pages of NaN after it, and NaN in the stale
    tail slots of each request's last page."""
    k, v, table = _pool(lengths, h_kv, d, 16, gen)
    nan = torch.full((spare, *k.shape[1:]), float("nan"), dtype=k.dtype)
    k, v = torch.cat([k, nan]), torch.cat([v, nan])
    for b, n in enumerate(lengths):
        last = int(table[b, (n - 1) // 16])
        k[last, :, n % 16 or 16 :] = float("nan")
        v[last, :, n % 16 or 16 :] = float("nan")
    return k, v, table


@pytest.mark.parametrize("window", [-1, 900])
def test_a_request_cut_in_many_items_agrees(window: int, passes: bool) -> None:
    """Requests longer than an item (several programs' partial sums added up), with a window
    that starts inside one, and stale slots and spare pages holding NaN: no NaN leaks."""
    gen = torch.Generator().manual_seed(7)
    lengths = [3 * fused.KEYS_PER_ITEM + 77, 5, fused.KEYS_PER_ITEM]
    k, v, table = _pool_with_nan(lengths, 2, 32, 4, gen)
    q_lens = [4, 2, 3]
    q = torch.randn(sum(q_lens), 6, 32, generator=gen, dtype=torch.float64)
    seq = torch.tensor(lengths)
    kwargs = {"bmm1_scale": 0.2, "bmm2_scale": 0.7, "window_left": window}
    (got,) = batched_attention(k, v, table, seq, q_lens, [Rounding(q)], use_fused=True, **kwargs)
    (want,) = batched_paged_attention(k, v, table, seq, q_lens, [Rounding(q)], **kwargs)
    assert not got.isnan().any()
    assert _close(got, want) <= 1e-12


_PLAN = fused.plan


def _lanes_noted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that each launch's plan from now on adds its lanes a program to (1:
    ``online``)."""
    made: list[int] = []

    def noted(*args: Any, **kwargs: Any) -> fused.Launch:
        launch = _PLAN(*args, **kwargs)
        made.append(launch.lanes)
        return launch

    monkeypatch.setattr(fused, "plan", noted)
    return made


def _one_pass(
    monkeypatch: pytest.MonkeyPatch, lanes: bool, args: list[Any], q_lens: Any, **kwargs: Any
) -> tuple[torch.Tensor, list[int]]:
    """The one pass's output with :data:`fused.LANES_ENABLED` ``lanes``, and the lanes a
    program of each launch it made (1: ``online``)."""
    monkeypatch.setattr(fused, "ONE_PASS", True)
    monkeypatch.setattr(fused, "LANES_ENABLED", lanes)
    made = _lanes_noted(monkeypatch)
    k, v, table, seq, q = args
    (out,) = batched_attention(k, v, table, seq, q_lens, [Rounding(q)], use_fused=True, **kwargs)
    return out, made


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("kv_dtype", [torch.float64, torch.bfloat16, torch.float8_e4m3fn])
def test_lanes_give_each_row_the_bits_of_a_program_of_its_own(
    monkeypatch: pytest.MonkeyPatch, kv_dtype: torch.dtype
) -> None:
    """Several (item, KV head) pairs in a program's rows (``online_lanes``, where a KV head
    has at most 8 rows) give every row the same values as a program of one pair
    (``online``): its products are the same shapes over its own query and keys, and
    everything else is its own. Over 60 random launches (1-3 requests, ``L`` 1-5, GQA 1, 2
    and 4, windows, sinks, draft trees, stale slots), as the cache dtype stores them."""
    used = set()
    for seed in range(60):
        case = random_case(seed, kv_dtype)
        p = paginate(case.ks, case.vs, case.page_size, dtype=kv_dtype)
        args = [p.k_pages, p.v_pages, p.block_tables, p.seq_lens, case.q]
        kwargs = {
            "bmm1_scale": case.bmm1_scale,
            "bmm2_scale": case.bmm2_scale,
            "window_left": case.window_left,
            "sinks": case.sinks,
            "draft_mask": case.draft_mask,
        }
        h_kv = p.k_pages.shape[1]
        rows = case.q_len * case.q.shape[1] // h_kv
        with np.errstate(invalid="ignore", over="ignore"):
            got, made = _one_pass(monkeypatch, True, args, case.q_len, **kwargs)
            assert made == [fused.lanes(rows, len(case.ks) * h_kv)]  # one item a request
            want, alone = _one_pass(monkeypatch, False, args, case.q_len, **kwargs)
        assert alone == [1]
        used |= set(made)
        assert _same_bits(got, want), seed
    assert used >= {1, 2, 4}, used  # (8 lanes: the next test's launch)


def test_lanes_across_items_heads_and_requests_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch whose lanes span requests, items of one request and KV heads (four KV heads
    of one query head, ``L`` of 2: 8 lanes a program, some past the launch's last), items
    of unequal lengths (a program runs to its longest lane), a window, and stale slots and
    spare pages holding NaN: the lanes' bits are ``online``'s, and both agree with the
    torch form."""
    gen = torch.Generator().manual_seed(17)
    lengths = [2 * fused.KEYS_PER_ITEM + 300, 9, fused.KEYS_PER_ITEM + 1, 40]
    k, v, table = _pool_with_nan(lengths, 4, 16, 3, gen)
    q_lens = [2, 1, 2, 2]
    q = torch.randn(sum(q_lens), 4, 16, generator=gen, dtype=torch.float64)
    args = [k, v, table, torch.tensor(lengths), q]
    kwargs = {"bmm1_scale": 0.3, "bmm2_scale": 1.1, "window_left": 2500}
    got, made = _one_pass(monkeypatch, True, args, q_lens, **kwargs)
    want, _ = _one_pass(monkeypatch, False, args, q_lens, **kwargs)
    assert made == [8]  # 8 items x 4 KV heads: 32 lanes, 4 programs
    assert _same_bits(got, want)
    (torch_form,) = batched_paged_attention(
        k, v, table, torch.tensor(lengths), q_lens, [Rounding(q)], **kwargs
    )
    assert not got.isnan().any()
    assert _close(got, torch_form) <= 1e-12


def test_how_many_lanes_a_program_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """As many (item, KV head) pairs as fit 16 rows, a power of two up to 8, no more than
    the launch has; one where no two fit, or where the lanes are turned off."""
    assert [fused.lanes(rows, 100) for rows in (1, 2, 3, 4, 5, 8, 9, 16, 40)] == [
        8, 8, 4, 4, 2, 2, 1, 1, 1,
    ]  # fmt: skip
    assert [fused.lanes(2, n) for n in (0, 1, 2, 3, 5, 7, 8)] == [1, 1, 2, 2, 4, 4, 8]
    monkeypatch.setattr(fused, "LANES_ENABLED", False)
    assert fused.lanes(2, 100) == 1


def _extreme_scores_launch() -> tuple[list[torch.Tensor], list[int], dict[str, Any]]:
    """A launch whose rows meet every score the one pass must rescale through: a request
    whose first item's scores are all ``-inf`` and whose next items' maxima rise by about 40
    a block (from -600 to +600: terms that underflow, rescales of ``exp(-40)``), a request
    one of whose keys scores ``+inf``, one whose every score is ``-inf``, and sinks."""
    gen = torch.Generator().manual_seed(11)
    d, h_kv, group = 16, 1, 2
    n_long = 2 * fused.KEYS_PER_ITEM + 40
    lengths = [n_long, 40, 30]
    ks = [torch.randn(n, h_kv, d, generator=gen, dtype=torch.float64) for n in lengths]
    vs = [torch.randn(n, h_kv, d, generator=gen, dtype=torch.float64) for n in lengths]
    # dim 0 carries the score: q's dim 0 is 1, the rest 0 (below)
    ramp = torch.linspace(-600.0, 600.0, n_long - fused.KEYS_PER_ITEM, dtype=torch.float64)
    ks[0][:, :, 0] = float("-inf")
    ks[0][fused.KEYS_PER_ITEM :, 0, 0] = ramp[torch.randperm(ramp.numel(), generator=gen)]
    ks[1][17, 0, 0] = float("inf")
    ks[2][:, :, 0] = float("-inf")
    p = paginate(ks, vs, 16)
    q_lens = [3, 2, 2]
    q = torch.zeros(sum(q_lens), h_kv * group, d, dtype=torch.float64)
    q[:, :, 0] = 1.0
    sinks = torch.tensor([0.5, -2.0], dtype=torch.float64)
    args = [p.k_pages, p.v_pages, p.block_tables, torch.tensor(lengths), q]
    return args, q_lens, {"bmm1_scale": 1.0, "bmm2_scale": 0.9, "sinks": sinks}


@pytest.mark.parametrize("with_sinks", [False, True])
def test_one_pass_agrees_through_extreme_scores(
    monkeypatch: pytest.MonkeyPatch, with_sinks: bool
) -> None:
    """The one pass's rescaling gives the definition's output (the torch form's) through
    rows that saw only ``-inf`` scores for a whole item, maxima that rise block after block
    over 1,200 (terms underflowing to 0 on the way), a ``+inf`` score (NaN where it is
    seen, as the definition gives) and rows that see no finite score at all (0, or with a
    sink 0 too); and the two passes give the same."""
    (k, v, table, seq, q), q_lens, kwargs = _extreme_scores_launch()
    if not with_sinks:
        kwargs["sinks"] = None
    with np.errstate(invalid="ignore", over="ignore"):  # the interpreter's numpy: inf - inf
        (want,) = batched_paged_attention(k, v, table, seq, q_lens, [Rounding(q)], **kwargs)
        outs = {}
        for one in (False, True):
            monkeypatch.setattr(fused, "ONE_PASS", one)
            (outs[one],) = batched_attention(
                k, v, table, seq, q_lens, [Rounding(q)], use_fused=True, **kwargs
            )
    nan_rows = want.isnan().any(dim=-1)
    # request 1's rows that see its +inf key (its 18th: rows at positions 38 and 39 do)
    assert nan_rows[3:5].all() and not nan_rows[:3].any() and not nan_rows[5:].any()
    assert bool((want[5:].abs() == 0).all())  # request 2: no finite score, output 0
    assert bool(want[:3].abs().max() > 0.1)  # request 0: its ramp's top keys carry it
    for one, got in outs.items():
        assert _close(got, want) <= 1e-12, one


def _one_key_values(v_row: torch.Tensor) -> torch.Tensor:
    """The oracle's output for one query row that sees one key whose value row is ``v_row``
    (``[D]``, any stored dtype): the value itself, widened to float64 by the kernels."""
    d = v_row.shape[0]
    k = torch.zeros(1, 1, 16, d, dtype=v_row.dtype)
    v = torch.zeros(1, 1, 16, d, dtype=v_row.dtype)
    v[0, 0, 0] = v_row
    q = torch.zeros(1, 1, d, dtype=torch.float64)
    (out,) = batched_attention(
        k,
        v,
        torch.zeros(1, 1, dtype=torch.int32),
        torch.tensor([1]),
        1,
        [Rounding(q)],
        bmm1_scale=1.0,
        bmm2_scale=1.0,
        use_fused=True,
    )
    return out[0, 0]


def test_every_fp8_value_is_widened_exactly() -> None:
    # (the sign of a zero does not survive a sum, here or in the torch form: not compared)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    got = _one_key_values(codes)
    want = codes.to(torch.float64)
    assert torch.equal(got.isnan(), want.isnan())
    assert int(got.isnan().sum()) == 2  # 0x7f and 0xff
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_bf16_values_are_widened_exactly() -> None:
    gen = torch.Generator().manual_seed(3)
    bits = torch.randint(-(2**15), 2**15, (256,), generator=gen, dtype=torch.int16)
    # subnormals (the least, the largest, a negative one), the least normal, the largest
    # finite, both infinities, a NaN and a negative NaN with a payload
    edges = [0x0001, 0x007F, -0x8000 + 0x7F, 0x0080, 0x7F7F, 0x7F80, -0x0080, 0x7FC0, -0x003F]
    bits[: len(edges)] = torch.tensor(edges, dtype=torch.int16)
    values = bits.view(torch.bfloat16)
    with np.errstate(invalid="ignore"):  # the interpreter's numpy: padding rows' 0 * inf
        got = _one_key_values(values)
    want = values.to(torch.float64)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_the_self_check_passes_and_sets_a_wrong_kernel_aside(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, passes: bool
) -> None:
    assert fused.checked(torch.device("cpu"))

    real = fused.paged_attention

    def off_by_a_little(*args: object, **kwargs: object) -> torch.Tensor:
        return real(*args, **kwargs) * (1 + 1e-9)  # type: ignore[arg-type]

    monkeypatch.setattr(fused, "paged_attention", off_by_a_little)
    monkeypatch.setattr(fused, "_checked", None)
    assert not fused.checked(torch.device("cpu"))
    assert "disagrees" in caplog.text
    assert not fused.usable(torch.device("cuda"))


@pytest.mark.parametrize("fault", ["off by a little", "does not build"])
def test_the_self_check_sets_wrong_lanes_aside_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """Lanes whose outputs differ from one pair a program (by 1e-9 of their partial sums),
    or whose kernel raises as a failed build would, are set aside by the first-use check
    alone: the fused oracle stays in use, with one pair a program."""
    monkeypatch.setattr(fused, "ONE_PASS", True)
    built = fused._build()
    real = built["online_lanes"]

    class Faulty:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                if fault == "does not build":
                    raise RuntimeError("a lanes variant that does not compile")
                real[grid](*args, **kwargs)
                kwargs["acc_part_ptr"].mul_(1 + 1e-9)

            return launch

    monkeypatch.setitem(built, "online_lanes", Faulty())
    assert fused.checked(torch.device("cpu"))
    assert fused._lanes_checked is False
    said = "lanes unavailable (RuntimeError" if fault == "does not build" else "lanes disagree"
    assert said in caplog.text
    assert fused.lanes(2, 100) == 1  # one pair a program from now on
    assert fused.usable(torch.device("cuda")) == fused._have_triton()


def test_the_self_check_keeps_lanes_that_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "ONE_PASS", True)
    assert fused.checked(torch.device("cpu"))
    assert fused._lanes_checked is True
    assert fused.lanes(2, 100) == 8


def _p_values(dtype: torch.dtype) -> torch.Tensor:
    """Non-negative float32 values to round to ``dtype``: every 257th bit pattern below inf,
    every finite value of ``dtype``, the midpoints between neighbours and a float32 ulp either
    side of each, float32's extremes, inf, NaN and values past ``dtype``'s largest."""
    strided = torch.arange(0, 0x7F800000, 257, dtype=torch.int64).to(torch.int32)
    n_codes = 256 if dtype == torch.float8_e4m3fn else 2**16
    codes = torch.arange(n_codes, dtype=torch.int32).to(
        torch.uint8 if dtype == torch.float8_e4m3fn else torch.int16
    )
    exact = codes.view(dtype).to(torch.float64)
    exact = exact[torch.isfinite(exact) & (exact >= 0)].unique().sort().values
    mid = ((exact[1:] + exact[:-1]) / 2).to(torch.float32)  # exact: one bit more
    top = exact[-1].to(torch.float32)
    specials = torch.tensor(
        [0.0, float("inf"), float("nan"), 3.4028234663852886e38, 1.4e-45, 1.1754943508222875e-38]
    )
    past = top * torch.tensor([1.0, 1.01, 1.03, 1.05, 1.07, 1.1, 2.0, 1e3])
    return torch.cat(
        [
            strided.view(torch.float32),
            exact.to(torch.float32),
            mid,
            torch.nextafter(mid, torch.tensor(float("inf"))),
            torch.nextafter(mid, torch.tensor(0.0)),
            specials,
            past,
        ]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_probabilities_are_rounded_as_torch_converts_them(dtype: torch.dtype) -> None:
    """The kernels' probability rounding (integer arithmetic on the bits) gives the bits of
    torch's ``to(dtype).to(float32)`` on about 8.4 million values of every kind, its
    overflow (inf, NaN, or saturation) probed from this torch."""
    import _fused_rounding

    x = _p_values(dtype)
    fmt = fused.P_FORMATS[dtype]
    over = fused.overflow(dtype, "cpu")
    assert over is not None
    y = torch.empty_like(x)
    block = 2**18
    with np.errstate(over="ignore"):  # the interpreter's numpy: inf rebuilt from its bits
        _fused_rounding.rounded_all[(-(-x.numel() // block),)](
            x, y, x.numel(), fmt.mbits, fmt.emin, fused.float_bits(fmt.largest),
            fused.float_bits(over), BLOCK=block,
        )  # fmt: skip
    want = x.to(dtype).to(torch.float32)
    assert torch.equal(y.isnan(), want.isnan())
    same = (y.view(torch.int32) == want.view(torch.int32)) | y.isnan()
    wrong = (~same).nonzero().flatten()[:5].tolist()
    assert not wrong, [(float(x[i]), float(y[i]), float(want[i])) for i in wrong]


def test_unrounded_probabilities_are_returned_as_they_are() -> None:
    import _fused_rounding

    x = _p_values(torch.bfloat16)
    y = torch.empty_like(x)
    with np.errstate(over="ignore"):  # the rounding is computed, then set aside
        _fused_rounding.rounded_all[(-(-x.numel() // 2**18),)](
            x, y, x.numel(), 0, 0, 0, 0, BLOCK=2**18
        )
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))


@pytest.mark.parametrize("keys_per_item", [512, 2048])
def test_the_check_sample_cuts_a_request_into_items_at_any_item_size(
    monkeypatch: pytest.MonkeyPatch, keys_per_item: int
) -> None:
    """The first-use check combines the items of one request: its sample's longest request is
    longer than an item, in launches without a window (a window starts a row's items late),
    whatever :data:`fused.KEYS_PER_ITEM` is (at 2,048 the old sample's 1,300 keys were one
    item)."""
    monkeypatch.setattr(fused, "KEYS_PER_ITEM", keys_per_item)
    cut = [
        launch
        for launch in fused._sample(torch.device("cpu"))
        if launch.kwargs["window_left"] < 0 and int(launch.seq_lens.max()) > keys_per_item
    ]
    assert len(cut) == 2


def test_the_check_sample_runs_every_form_of_the_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first-use check of the lanes builds and runs the one pass with one pair a
    program and with 2, 4 and 8 lanes (so a Triton that cannot build a lanes variant sets
    them aside at first use, not in the middle of a campaign), and they agree."""
    monkeypatch.setattr(fused, "ONE_PASS", True)
    made = _lanes_noted(monkeypatch)
    assert fused._lanes_agree(torch.device("cpu"))
    assert made[0::2] == [4, 1, 8, 2]  # with lanes: KV heads of 4, 12, 2 and 8 rows
    assert made[1::2] == [1, 1, 1, 1]  # and without, to compare


def test_the_float32_roundings_pass_their_first_use_check() -> None:
    """The check sample (every cache dtype, a window, sinks, a tree, ragged rows, a request
    of many items), each float32 rounding within its allowance of the torch form."""
    assert fused._floors_agree(torch.device("cpu"))


def test_generated_cases_floors_are_the_torch_forms() -> None:
    """Every fourth generated case: each request's floor from each float32 rounding, as the
    framework takes it (rounded to the output dtype), within :data:`_floors.FLOOR_RATIO` of
    the torch form's; and the roundings themselves as near as the first-use check allows."""
    batches = _drawn()[::4]
    assert any(b.k_pages.dtype == torch.float8_e4m3fn for b in batches)
    assert any(not b.is_chain_draft for b in batches)
    for n, batch in enumerate(batches):
        assert _floors.worst_ratio(batch) <= _floors.FLOOR_RATIO, n
        ref, want = _floors.outputs(batch, fused_form=False)
        _, got = _floors.outputs(batch, fused_form=True)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.float32
            distance, allowed = fused.floors_distance(g, w, ref)
            assert distance <= allowed, (n, distance, allowed)


@pytest.mark.parametrize("seed", range(6))
def test_a_requests_floors_in_a_launch_are_its_floors_alone(seed: int) -> None:
    """Bit for bit: a request's float32 roundings do not depend on the launch around it (each
    program reads one request's keys; its items are added in order), so a case judged in a
    packed launch and replayed alone is held to the same floor."""
    launch = ragged_launch(seed)
    p = launch.paged
    roundings = fused.floor_roundings(launch.q)
    together = batched_attention(
        p.k_pages, p.v_pages, p.block_tables, p.seq_lens, launch.q_lens, roundings,
        draft_mask=launch.draft, use_fused=True, **launch.kwargs,
    )  # fmt: skip
    start = 0
    for b, n in enumerate(launch.q_lens):
        rows = slice(start, start + n)
        alone = batched_attention(
            p.k_pages, p.v_pages, p.block_tables[b : b + 1], p.seq_lens[b : b + 1], n,
            [Rounding(r.q[rows], r.compute_dtype, r.p_dtype) for r in roundings],
            draft_mask=launch.masks[b][:n, :n], use_fused=True, **launch.kwargs,
        )  # fmt: skip
        for whole, one in zip(together, alone, strict=True):
            assert torch.equal(whole[rows].view(torch.int32), one.view(torch.int32)), (b, n)
        start += n


def _drop_probability_rounding(real: Any) -> Any:
    def wrong(launch: Any, rounding: Rounding, *rest: Any) -> torch.Tensor:
        return real(launch, Rounding(rounding.q, rounding.compute_dtype, None), *rest)

    return wrong


@pytest.mark.parametrize(
    "mistake",
    [
        _drop_probability_rounding,
        lambda real: lambda *args: real(*args) * (1 + 2e-4),
    ],
    ids=["probabilities-not-rounded", "off-by-2e-4"],
)
def test_the_floors_check_sets_wrong_float32_kernels_aside(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mistake: Any
) -> None:
    """A float32 rounding that forgets to round its probabilities, or is off by 2e-4 (about
    TF32's error on these scores), fails the check: the floors take the torch form, and the
    float64 oracle, checked on its own, stays fused."""
    monkeypatch.setattr(fused, "_checked", True)
    real = fused.paged_attention

    def float32_wrong(launch: Any, rounding: Rounding, *rest: Any) -> torch.Tensor:
        if rounding.compute_dtype == torch.float32:
            return mistake(real)(launch, rounding, *rest)  # type: ignore[no-any-return]
        return real(launch, rounding, *rest)

    monkeypatch.setattr(fused, "paged_attention", float32_wrong)
    assert not fused.floors_checked(torch.device("cpu"))
    assert "noise floors disagree" in caplog.text
    assert not fused.floors_usable(torch.device("cuda"))
    assert fused.checked(torch.device("cpu"))


def test_the_framework_routes_the_floors_through_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A launch whose path is over its allowance measures the noise floors
    (:func:`difftest.execution.bounds.settle`) with the kernels where they may run, and its
    verdict is what the torch form's floors give."""
    from difftest.calibration import mutants  # noqa: F401  (registers the mutant paths)
    from difftest.execution.evaluate import evaluate_pack
    from difftest.paths.registry import get_path

    drawn = sample_cases(cases(limits=SMALL), seed=31, count=40)
    case = next(c for c in drawn if c.attention.bmm2_scale != 1.0)
    paths = [get_path("torch-sdpa"), get_path("mutant-bmm2-in-softmax")]
    (plain,) = evaluate_pack([case], paths, "cpu")
    kinds: list[tuple[torch.dtype, torch.dtype | None]] = []
    real = fused.paged_attention

    def counting(launch: Any, rounding: Rounding, *rest: Any) -> torch.Tensor:
        kinds.append((rounding.compute_dtype, rounding.p_dtype))
        return real(launch, rounding, *rest)

    monkeypatch.setattr(fused, "paged_attention", counting)
    monkeypatch.setattr(fused, "usable", lambda device: True)
    monkeypatch.setattr(fused, "floors_usable", lambda device: True)
    monkeypatch.setattr(fused, "_checked", True)
    monkeypatch.setattr(fused, "_floors_checked", True)
    (result,) = evaluate_pack([case], paths, "cpu")
    assert (torch.float64, None) in kinds
    assert any(dtype == torch.float32 for dtype, _ in kinds), kinds
    assert [r.outcome for r in result.results] == [r.outcome for r in plain.results]
    assert result.results[1].outcome.value == "WRONG"


def _kernels_made_usable(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The float64 kernels made usable on the CPU (under the interpreter) as if checked (the
    first-use check has its own test above); the list returned grows by one a call."""
    calls: list[int] = []
    real = fused.paged_attention

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fused, "paged_attention", counting)
    monkeypatch.setattr(fused, "usable", lambda device: True)
    monkeypatch.setattr(fused, "_checked", True)
    return calls


def test_the_framework_routes_the_oracle_through_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A launch's oracle pass (:mod:`difftest.execution.bounds`) computes its float64 output
    with the kernels where they may run (here: made usable on the CPU, under the
    interpreter); a launch that agrees within its allowances measures no floors."""
    from difftest.execution.evaluate import evaluate_pack
    from difftest.paths.registry import get_path

    calls = _kernels_made_usable(monkeypatch)
    case = sample_cases(cases(limits=SMALL), seed=27, count=1)[0]
    (result,) = evaluate_pack([case], [get_path("torch-sdpa")], "cpu")
    assert calls == [1]
    assert result.results[0].outcome.value == "AGREE"


STORED_CASES = 60
"""Stored cases judged with the kernels below: those of the list's first 60 (about a minute
a form under the interpreter); the whole list of 200 kept its verdicts in both forms when
run once (docs/validation.md, Run 38)."""


@pytest.mark.slow  # about a minute a form: the kernels under Triton's interpreter
def test_the_stored_verdicts_are_the_kernels_verdicts(
    monkeypatch: pytest.MonkeyPatch, passes: bool
) -> None:
    """Speed must not change a verdict: the stored list (``tests/data/verdicts.json``,
    computed with the torch form on the CPU) judged with the float64 oracle in the kernels,
    in both forms, keeps every verdict, the mutant kernels' WRONG ones among them."""
    import test_verdict_stability as stored_list

    from difftest.execution.evaluate import evaluate
    from difftest.model.case import Case

    calls = _kernels_made_usable(monkeypatch)
    entries = stored_list._stored()["cases"][:STORED_CASES]
    changed, wrong = [], 0
    for n, entry in enumerate(entries):
        case = Case.from_json(entry["case"])
        got = stored_list.verdicts(evaluate(case, stored_list._paths(case)))
        wrong += sum(v[0] == "WRONG" for v in got.values())
        if got != entry["verdicts"]:
            changed.append(n)
    assert len(calls) >= len(entries)  # every case's oracle was the kernels'
    assert wrong >= 20, wrong
    assert not changed, f"verdicts changed with the kernels (one pass: {passes}): {changed}"


def test_no_runtime_argument_is_specialised_on() -> None:
    """Triton compiles a variant per specialisation of an argument (an integer's value, a
    pointer's alignment): every argument that changes from launch to launch is exempt, so the
    variants are the cache dtypes and the head-dim blocks, compiled once each. (A GPU campaign
    recompiled the kernels while the slices of the packed index tensor were aligned or not by
    the batch size's parity: docs/validation.md, Run 25.) The one exception is the cache's
    two pointers, on their alignment alone, which a campaign's launches always have
    (:func:`test_campaign_launches_read_the_cache_aligned`)."""
    from triton.runtime.jit import JITFunction

    from difftest.oracle import fused_kernels

    kernels = (
        fused_kernels.maxima,
        fused_kernels.sums,
        fused_kernels.online,
        fused_kernels.combine,
    )
    for kernel in kernels:
        if not isinstance(kernel, JITFunction):  # imported under the interpreter: its wrapper
            kernel = JITFunction(kernel.fn, **kernel.kwargs)
        specialised = [
            p.name
            for p in kernel.params
            if not p.is_constexpr and not (p.do_not_specialize and p.do_not_specialize_on_alignment)
        ]
        reads_cache = "k_ptr" in [p.name for p in kernel.params]
        assert specialised == (["k_ptr", "v_ptr"] if reads_cache else []), kernel.__name__
        assert all(p.do_not_specialize for p in kernel.params if not p.is_constexpr)
        assert any(p.is_constexpr for p in kernel.params)


@pytest.mark.parametrize("storage", ["hnd", "nhd", "kv_split_nhd"])
def test_campaign_launches_read_the_cache_aligned(storage: str) -> None:
    """Every launch of generated cases, packed as a campaign packs them into one pool, is
    read 16 bytes at a time (``ALIGNED``): generated head dims are multiples of 16, so are the
    pools' strides, and the pool and its V half start aligned. So the cache pointers'
    specialisation on alignment compiles nothing a campaign would not."""
    drawn = sample_cases(cases(limits=SMALL), seed=27, count=40)
    dims = set()
    for group in packing.group_for_launches(drawn, 8):
        group = [c.replace(pool=dataclasses.replace(c.pool, kv_storage=storage)) for c in group]
        whole, parts = packing.launch_pool(group, torch.device("cpu"))
        queries, rows = packing.launch_queries(group, torch.device("cpu"))
        into = [
            materialize(c, pool=part, queries=q)
            for c, part, q in zip(group, parts, rows, strict=True)
        ]
        batch = packing.pack(into, whole, queries).batch
        k, v = (fused.cache_source(t) for t in (batch.k_pages, batch.v_pages))
        assert fused.aligned(k, v, batch.q.shape[-1]), [c.attention for c in group]
        dims |= {c.attention.head_dim for c in group}
    assert len(dims) >= 3, dims


def test_the_elementwise_reads_give_the_same_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache the kernels cannot read 16 bytes at a time is read an element at a time: the
    same values, so the same bits out, on generated cases in both forms of the oracle."""
    batches = _drawn()[:12]
    for one in (False, True):
        monkeypatch.setattr(fused, "ONE_PASS", one)
        wide = [_fused(b) for b in batches]
        with monkeypatch.context() as m:
            m.setattr(fused, "aligned", lambda *_: False)
            narrow = [_fused(b) for b in batches]
        for a, b in zip(wide, narrow, strict=True):
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
            assert torch.equal(a.isnan(), b.isnan())


def test_a_pipeline_depth_and_a_register_cap_reach_the_launch_and_change_no_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Blocks.stages`` and ``Blocks.regs`` (what ``benchmarks/sweep_device_kernels.py``
    varies) are passed to the float64 steps' launches as Triton's ``num_stages`` and
    ``maxnreg``; neither orders a sum, so the outputs are the same bits."""
    batches = _drawn()[:6]
    want = [_fused(b) for b in batches]
    original = fused.block_sizes
    monkeypatch.setattr(
        fused, "block_sizes", lambda d: dataclasses.replace(original(d), stages=2, regs=128)
    )
    seen: list[object] = []

    class Spy:
        """A kernel that notes the ``num_stages`` and ``maxnreg`` of each launch, then
        launches."""

        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                seen.append((kwargs.get("num_stages"), kwargs.get("maxnreg")))
                return self.kernel[grid](*args, **kwargs)

            return launch

    built = fused._build()
    for name in ("online", "maxima", "sums"):
        monkeypatch.setitem(built, name, Spy(built[name]))
    got = [_fused(b) for b in batches]
    assert seen and all(s == (2, 128) for s in seen)
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())
