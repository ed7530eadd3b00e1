"""The oracle reads nothing back from the device: a launch's lengths come from its case.

On a GPU every read of a tensor's values on the host (``tolist``, ``item``, a boolean index, a
tensor made from a host list) waits for everything queued before it: the oracle then idles
the host while the device finishes the launch's generation and paths, and the device while
the host prepares the oracle. :func:`difftest.judgement.tolerance.oracle_outputs` gives the
oracle each request's ``T_b`` and ``L_b`` from the case (``HostLens``), so neither form reads
a length back; a ragged chunk's rows are placed by indices made on the host, not a mask.

Checked on the CPU, where a read costs nothing but can be seen: ``Tensor.tolist`` refused
(it does not dispatch, so the census cannot see it), and the census of
:mod:`difftest.execution.op_census` counting the operations that would wait, over the stored
cases, packed launches, ragged launches cut in several chunks, and the fused form's host part
(its kernels stubbed: what they compute has its own tests). The outputs are the bits of the
oracle that reads the lengths back.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _floors
import pytest
import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.execution.op_census import Census
from difftest.generation.materialize import materialize
from difftest.generation.modes import Modes
from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.oracle import batched, fused
from difftest.oracle.batched import Rounding, batched_paged_attention
from difftest.paths.registry import Precision

STORED = Path(__file__).parents[1] / "data" / "verdicts.json"
PRECISIONS = (
    Precision(p_dtype="bf16"),
    Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3"),
    Precision(p_dtype="fp32"),
)


def _batches() -> Iterator[tuple[str, Batch]]:
    stored = json.loads(STORED.read_text())
    for n, entry in enumerate(stored["cases"][::10]):
        yield f"stored case {10 * n}", materialize(Case.from_json(entry["case"]))
    for n, entry in enumerate(stored["launches"][:4]):
        group = [materialize(Case.from_json(c)) for c in entry["cases"]]
        yield f"stored launch {n}", packing.pack(group).batch
    config = CampaignConfig(seed=5, pack=4, cases_per_variant=4, modes=Modes(ragged=True))
    planned = (c for _, c in planned_cases(config, "cpu"))
    ragged = (g for g in packing.group_for_launches(planned, 4) if g[0].batch.is_ragged)
    for n, group in enumerate(itertools.islice(ragged, 4)):
        yield f"ragged launch {n}", packing.pack([materialize(c) for c in group]).batch


def _read_back(batch: Batch, roundings: list[Rounding]) -> list[torch.Tensor]:
    """The torch form as it ran before, reading the lengths from the batch's tensors."""
    args, kwargs = _floors.launch(batch)
    return batched_paged_attention(*args, roundings, **kwargs)


@pytest.mark.parametrize("chunk_elements", [batched.CHUNK_ELEMENTS, 2**13])
def test_the_torch_form_reads_nothing_back(
    chunk_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch's oracle and floors without a read or a waiting operation, one chunk or
    many (a small chunk size cuts each launch in several, ragged ones placed by index), and
    the same bits as the form that reads its lengths back."""
    monkeypatch.setattr(batched, "CHUNK_ELEMENTS", chunk_elements)
    seen_ragged = 0
    for name, batch in _batches():
        seen_ragged += batch.is_ragged
        census = Census()
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", _refuse)
            with census:
                ref, lows = compare.oracle_outputs(batch, PRECISIONS)
        assert sum(census.waits.values()) == 0, (name, dict(census.waits))
        q = batch.q
        low_q = {d: compare._low_q(q, d) for d in (None, "fp8_e4m3")}
        roundings = [Rounding(q)] + [
            Rounding(low_q[p.q_dtype], torch.float32, compare._P_DTYPES[p.p_dtype])
            for p in PRECISIONS
        ]
        want = _read_back(batch, roundings)
        assert torch.equal(ref.view(torch.int64), want[0].view(torch.int64)), name
        for p, w in zip(PRECISIONS, want[1:], strict=True):
            rounded = w.to(batch.out_dtype).double()
            assert torch.equal(lows[p].view(torch.int64), rounded.view(torch.int64)), (name, p)
    assert seen_ragged >= 4


def _refuse(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"tolist of a {tuple(self.shape)} tensor: read back")


class _Stub:
    """A kernel that records its launches and computes nothing."""

    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def __getitem__(self, grid: Any) -> Any:
        def launch(**kwargs: Any) -> None:
            self.calls.append(self.name)

        return launch


@pytest.mark.parametrize("one_pass", [False, True], ids=["two-passes", "one-pass"])
def test_the_fused_forms_host_part_reads_nothing_back(
    monkeypatch: pytest.MonkeyPatch, one_pass: bool
) -> None:
    """The fused form's plan and launches (kernels stubbed) on every batch: no read, no
    waiting operation; three kernels for the float64 oracle in two passes, two in one (the
    default), and two more for each float32 rounding after the first of its queries (whose
    maxima it shares; the roundings always take two passes)."""
    calls: list[str] = []
    names = ("maxima", "sums", "online", "online_lanes", "combine")
    stubs = {name: _Stub(calls, name) for name in names}
    monkeypatch.setattr(fused, "_build", lambda: stubs)
    lanes: list[int] = []
    plan = fused.plan

    def noted(*args: Any, **kwargs: Any) -> fused.Launch:
        launch = plan(*args, **kwargs)
        lanes.append(launch.lanes)
        return launch

    monkeypatch.setattr(fused, "plan", noted)
    one_pass_kernels = set()
    monkeypatch.setattr(fused, "ONE_PASS", one_pass)
    monkeypatch.setattr(fused, "usable", lambda device: True)
    monkeypatch.setattr(fused, "floors_usable", lambda device: True)
    monkeypatch.setattr(fused, "_checked", True)
    monkeypatch.setattr(fused, "_floors_checked", True)
    for p_dtype in fused.P_FORMATS:  # probed once a process, at first use: a read, once
        fused.overflow(p_dtype, "cpu")
    for name, batch in _batches():
        calls.clear()
        lanes.clear()
        census = Census()
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", _refuse)
            with census:
                compare.oracle_outputs(batch, PRECISIONS, fused.batched_attention)
        assert sum(census.waits.values()) == 0, (name, dict(census.waits))
        # float64: 3 (one pass: 2); bf16 queries: fp32 p then bf16 p (shared maxima); fp8: 3
        # (the one pass: several (item, KV head) pairs a program where a KV head has few rows)
        assert len(lanes) == 1, name  # one plan for the batch's roundings
        online = "online_lanes" if lanes[0] > 1 else "online"
        float64 = [online, "combine"] if one_pass else ["maxima", "sums", "combine"]
        floors = ["maxima"] * 2 + ["sums"] * 3 + ["combine"] * 3
        assert sorted(calls) == sorted(float64 + floors), name
        one_pass_kernels.add(online)
    if one_pass:  # both forms of the one pass were launched
        assert one_pass_kernels == {"online", "online_lanes"}, one_pass_kernels
