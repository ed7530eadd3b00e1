"""``tolerance.locate`` (where a wrong verdict is wrong: each wrong request's rows and heads,
worst first) reduces on the device and reads back once; it must say exactly what the request
by request form said, which is kept here as the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from difftest.execution.op_census import Census
from difftest.judgement.tolerance import MAX_LOCATED_REQUESTS, locate
from difftest.model.outcome import ErrorLocation


def _reference(
    bad: torch.Tensor, err: torch.Tensor, bound: torch.Tensor, row_request: torch.Tensor
) -> tuple[ErrorLocation, ...]:
    """Request by request: each wrong request's rows and heads picked out on their own."""
    rows, heads = bad.shape[0], bad.shape[1]
    per_row = bad.reshape(rows, heads, -1)
    e = torch.nan_to_num(err, nan=float("inf")).reshape(rows, -1).amax(dim=1)
    req_max = torch.zeros(bound.shape[0], dtype=e.dtype).scatter_reduce(
        0, row_request, e, "amax", include_self=True
    )
    wrong = sorted(set(row_request[per_row.any(dim=(1, 2))].tolist()))
    ratio = (req_max / bound.clamp_min(1e-300)).tolist()
    wrong.sort(key=lambda b: -ratio[b])
    located = []
    for b in wrong[:MAX_LOCATED_REQUESTS]:
        cells = per_row[(row_request == b).nonzero().flatten()]
        located.append(
            ErrorLocation(
                request=b,
                rows=tuple(cells.any(dim=(1, 2)).nonzero().flatten().tolist()),
                heads=tuple(cells.any(dim=(0, 2)).nonzero().flatten().tolist()),
                max_abs=req_max.tolist()[b],
                bound=bound.tolist()[b],
            )
        )
    return tuple(located)


@settings(max_examples=150, deadline=None)
@given(
    rows_of=st.lists(st.integers(1, 5), min_size=1, max_size=24),
    heads=st.integers(1, 4),
    dim=st.integers(1, 3),
    seed=st.integers(0, 2**31 - 1),
    share=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    tied=st.booleans(),
    float32_bound=st.booleans(),
)
def test_locate_says_what_the_request_by_request_form_says(
    rows_of: list[int],
    heads: int,
    dim: int,
    seed: int,
    share: float,
    tied: bool,
    float32_bound: bool,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    bs = len(rows_of)
    row_request = torch.repeat_interleave(torch.arange(bs), torch.tensor(rows_of))
    rows = int(row_request.numel())
    err = torch.rand(rows, heads, dim, generator=gen, dtype=torch.float64)
    if tied:  # equal ratios: the order among them is the requests' own
        err = torch.full_like(err, 0.5)
    err[torch.rand(rows, heads, dim, generator=gen) < 0.02] = float("nan")
    bad = (torch.rand(rows, heads, dim, generator=gen) < share) | err.isnan()
    bound = torch.rand(bs, generator=gen, dtype=torch.float64) + 0.1
    if tied:
        bound = torch.ones(bs, dtype=torch.float64)
    if float32_bound:
        bound = bound.float()
    assert locate(bad, err, bound, row_request) == _reference(bad, err, bound, row_request)


def test_many_wrong_requests_are_located_worst_first_with_one_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bs, per, heads, dim = 40, 3, 2, 4
    row_request = torch.arange(bs).repeat_interleave(per)
    err = torch.arange(bs * per * heads * dim, dtype=torch.float64).reshape(-1, heads, dim)
    bad = torch.zeros_like(err, dtype=torch.bool)
    bad[1::per, 1, 2] = True  # each request's second row, second head
    bound = torch.ones(bs, dtype=torch.float64)
    reads = []
    tolist = torch.Tensor.tolist

    def counted(t: torch.Tensor) -> object:
        reads.append(t.shape)
        return tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with Census() as ops:
        got = locate(bad, err, bound, row_request)
    assert len(reads) == 1 and not ops.waits  # one read back, no operation that waits
    monkeypatch.undo()
    assert got == _reference(bad, err, bound, row_request)
    assert len(got) == MAX_LOCATED_REQUESTS
    assert [g.request for g in got] == list(range(bs - 1, bs - 1 - MAX_LOCATED_REQUESTS, -1))
    assert all(g.rows == (1,) and g.heads == (1,) for g in got)
