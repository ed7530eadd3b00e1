"""The fused Triton store writes the torch form's bytes on the GPU: its first-use check passes
here, whole cases (every tensor of the stored cases of ``tests/data/verdicts.json`` and of
``tests/data/generation_bits.json``) built with it and without are the same bit for bit, and
so are the stored packed launches, their stores run together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from difftest.execution import packing
from difftest.generation import fused_normals, fused_store, placement
from difftest.generation import materialize as m
from difftest.model.case import Case

DATA = Path(__file__).parents[1] / "data"

pytestmark = pytest.mark.skipif(
    not fused_normals._have_triton(), reason="Triton is not installed: nothing fused to test"
)


def test_the_first_use_check_passes_here() -> None:
    assert fused_store.agrees(torch.device("cuda"), m._store_torch)


def _bytes(case: Case, fused: bool) -> dict[str, torch.Tensor]:
    before = fused_store.ENABLED
    fused_store.ENABLED = fused
    try:
        batch = m.materialize(case, "cuda")
    finally:
        fused_store.ENABLED = before
    return {
        name: value.contiguous().view(-1).view(torch.uint8)
        for name, value in vars(batch).items()
        if isinstance(value, torch.Tensor)
    }


@pytest.mark.parametrize("stored", ["verdicts.json", "generation_bits.json"])
def test_every_stored_case_is_built_with_the_same_bits(stored: str) -> None:
    cases = [Case.from_json(e["case"]) for e in json.loads((DATA / stored).read_text())["cases"]]
    calls = 0
    real = fused_store.launch

    def counting(segments: list[fused_store.Segment]) -> None:
        nonlocal calls
        calls += len(segments)
        real(segments)

    fused_store.launch = counting  # type: ignore[assignment]
    try:
        differ = []
        for n, case in enumerate(cases):
            fused, plain = _bytes(case, True), _bytes(case, False)
            assert fused.keys() == plain.keys() and "kv_storage" in fused
            differ += [f"case {n} {k}" for k in fused if not torch.equal(fused[k], plain[k])]
    finally:
        fused_store.launch = real  # type: ignore[assignment]
    assert calls >= 3 * len(cases)  # the kernel did run: K, V and queries of each case
    assert not differ, differ[:10]


def _launch_bytes(cases: list[Case], fused: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A launch's pool and query rows materialised as a campaign does (each case into its
    part, the plans in one copy, the stores together), as bytes, and how many kernel launches
    stored them."""
    before, real = fused_store.ENABLED, fused_store.launch
    launches = 0

    def counting(segments: list[fused_store.Segment]) -> None:
        nonlocal launches
        launches += 1
        real(segments)

    fused_store.ENABLED, fused_store.launch = fused, counting  # type: ignore[assignment]
    try:
        cuda = torch.device("cuda")
        storage, pools = packing.launch_pool(cases, cuda)
        queries, rows = packing.launch_queries(cases, cuda)
        plans = placement.on_device([placement.place(c) for c in cases], cuda)
        storage.fill_(7)  # what an uninitialised pool may hold: it must all be overwritten
        with m.stores_together():
            for case, pool, q, plan in zip(cases, pools, rows, plans, strict=True):
                m.materialize(case, cuda, pool=pool, queries=q, plan=plan)
    finally:
        fused_store.ENABLED, fused_store.launch = before, real  # type: ignore[assignment]
    raw = (t.contiguous().view(-1).view(torch.uint8) for t in (storage, queries))
    return (*raw, launches)  # type: ignore[return-value]


def test_every_stored_launch_is_built_with_the_same_bits_in_two_kernel_launches() -> None:
    """A packed launch's stores run together (``materialize.stores_together``): every case's
    K, V and stale slots in one kernel launch, their query rows in another, the torch form's
    bytes."""
    entries = json.loads((DATA / "verdicts.json").read_text())["launches"]
    differ = []
    for n, entry in enumerate(entries):
        cases = [Case.from_json(c) for c in entry["cases"]]
        fused_pool, fused_q, launches = _launch_bytes(cases, True)
        plain_pool, plain_q, _ = _launch_bytes(cases, False)
        assert launches == 2, (n, launches)
        differ += [f"launch {n} pool"] if not torch.equal(fused_pool, plain_pool) else []
        differ += [f"launch {n} queries"] if not torch.equal(fused_q, plain_q) else []
    assert not differ, differ
