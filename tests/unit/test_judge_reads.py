"""``tolerance.judge`` reads a verdict's figures back at once where every output is finite;
it must give exactly what the figure-by-figure form gives (kept as ``_judge_nonfinite``,
which still judges outputs that are not all finite).

On a GPU each read of a figure is a wait for the device: judging a case that does not agree
(a finding, or one a launch's batched judgement could not settle) waited about twelve times
(``benchmarks/count_gpu_waits.py`` on the H200: 15.6 of 19.6 waits a case, Run 35)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from difftest.execution.op_census import Census
from difftest.judgement import tolerance
from difftest.model.outcome import PathResult


def _batch(rows_of: list[int]) -> Any:
    """What ``judge`` reads of a batch: its size and each row's request."""
    row_request = torch.repeat_interleave(torch.arange(len(rows_of)), torch.tensor(rows_of))
    return SimpleNamespace(batch_size=len(rows_of), row_requests=lambda: row_request)


def _same(a: PathResult, b: PathResult) -> bool:
    """Equal results, NaN figures equal to NaN."""

    def plain(r: PathResult) -> str:
        return repr(r).replace("nan", "NaN")

    return plain(a) == plain(b)


@settings(max_examples=200, deadline=None)
@given(
    rows_of=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    heads=st.integers(1, 3),
    dim=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    noise=st.sampled_from([0.0, 1e-6, 1e-3, 0.3]),
    spoil=st.sampled_from(["none", "none", "nan", "inf", "unwritten", "zero_ref"]),
    with_within=st.booleans(),
    float32_bound=st.booleans(),
    out_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
)
def test_judge_gives_what_the_figure_by_figure_form_gives(
    rows_of: list[int],
    heads: int,
    dim: int,
    seed: int,
    noise: float,
    spoil: str,
    with_within: bool,
    float32_bound: bool,
    out_dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(rows_of)
    rows, bs = sum(rows_of), len(rows_of)
    ref = torch.randn(rows, heads, dim, generator=gen, dtype=torch.float64)
    if spoil == "zero_ref":
        ref.zero_()
    out = (ref + noise * torch.randn(rows, heads, dim, generator=gen, dtype=torch.float64)).to(
        out_dtype
    )
    row = int(torch.randint(rows, (1,), generator=gen))
    if spoil == "nan":
        out[row, 0, 0] = float("nan")
    elif spoil == "inf":
        out[row, -1, -1] = float("inf")
    elif spoil == "unwritten":
        out[row] = float("nan")
    bound = 1e-3 * (torch.rand(bs, generator=gen, dtype=torch.float64) + 0.5)
    within = bound * torch.rand(bs, generator=gen, dtype=torch.float64) if with_within else None
    if float32_bound:
        bound = bound.float()
        within = None if within is None else within.float()
    got = tolerance.judge("p", batch, out, ref, bound, within)
    want = tolerance._judge_nonfinite("p", batch, out, ref, bound, within)
    assert _same(got, want), (got, want)


@pytest.mark.parametrize("wrong", [False, True])
def test_a_finite_verdict_is_read_back_at_once(
    monkeypatch: pytest.MonkeyPatch, wrong: bool
) -> None:
    """Every output finite: one read for the figures, one more for a wrong verdict's
    locations; the figure-by-figure form waited eight to twelve times."""
    rows_of = [3] * 20
    batch = _batch(rows_of)
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(60, 2, 8, generator=gen, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    if wrong:
        out[4::9] *= 1.5
    bound = torch.full((20,), 0.02, dtype=torch.float64)
    with _reads(monkeypatch) as new, Census() as new_ops:
        got = tolerance.judge("p", batch, out, ref, bound, bound / 2)
    with _reads(monkeypatch) as old, Census() as old_ops:
        want = tolerance._judge_nonfinite("p", batch, out, ref, bound, bound / 2)
    assert _same(got, want)
    assert got.outcome.name == ("WRONG" if wrong else "AGREE")
    assert len(new) + sum(new_ops.waits.values()) == (2 if wrong else 1), (new, new_ops.waits)
    assert len(old) + sum(old_ops.waits.values()) >= 8, (old, old_ops.waits)
    assert math.isfinite(got.metrics.max_abs)


@contextlib.contextmanager
def _reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each read of a tensor's values by the host (on a GPU, a wait for the device): ``tolist``,
    ``item`` and the scalar conversions, by name. Operations that wait (a boolean mask's
    indexing) are :class:`Census`'s."""
    seen: list[str] = []
    with monkeypatch.context() as m:
        for name in ("tolist", "item", "__float__", "__int__", "__bool__"):
            real = getattr(torch.Tensor, name)

            def counted(t: torch.Tensor, *a: Any, _real: Any = real, _name: str = name) -> Any:
                seen.append(_name)
                return _real(t, *a)

            m.setattr(torch.Tensor, name, counted)
        yield seen
