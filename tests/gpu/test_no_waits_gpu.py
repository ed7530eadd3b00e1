"""On the GPU, materialising and packing cases, and the oracle, never make the host wait for
the device.

``tests/unit/test_placement.py`` shows on the CPU that generation's GPU route dispatches no
operation that waits (by the census of :mod:`difftest.execution.op_census`). Here the CUDA
runtime says so itself: with ``torch.cuda.set_sync_debug_mode("error")`` any operation that
synchronises the host with the device raises. The stored cases of
``tests/data/generation_bits.json`` are materialised (fused store or not) and a default
campaign's first launches packed, under it, after a first case outside it (first use: the
fused store's check, Triton's compile, which may wait). The bits are checked too: every
tensor the same bytes as the CPU's (whose bits ``tests/unit/test_generation_bits.py`` pins),
with the plan moved by one copy from pinned memory. The oracle and its noise floors (fused,
or the floors in the torch form) run on those cases and on packed launches under it too.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.generation import fused_store
from difftest.generation.materialize import materialize
from difftest.generation.strategies import LIMITS
from difftest.model.batch import Batch
from difftest.model.case import Case

CUDA = torch.device("cuda")
STORED = Path(__file__).parents[1] / "data" / "generation_bits.json"


def _same_bytes(mine: Batch, cpu: Batch) -> None:
    for name in ("q_padded", "kv_storage", "block_tables", "seq_lens", "sinks", "draft_mask"):
        a, b = getattr(mine, name), getattr(cpu, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(
                a.cpu().contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
            ), name


def _sync_debug_mode(mode: int | str) -> None:
    # torch warns, each time the mode is set, that it is a prototype that may miss some
    # waits (the tests turn warnings into errors); what it does catch, it raises on
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Synchronization debug mode", UserWarning)
        torch.cuda.set_sync_debug_mode(mode)


@contextmanager
def _waits_raise() -> Iterator[None]:
    torch.cuda.synchronize()
    before = torch.cuda.get_sync_debug_mode()
    try:
        _sync_debug_mode("error")
        yield
    finally:  # restored even when setting it failed: a later test must not inherit it
        _sync_debug_mode(before)


@pytest.mark.parametrize("fused", [True, False])
def test_materialising_waits_for_nothing_and_gives_the_stored_bits(fused: bool) -> None:
    cases = [Case.from_json(e["case"]) for e in json.loads(STORED.read_text())["cases"]]
    before = fused_store.ENABLED
    fused_store.ENABLED = fused
    try:
        materialize(cases[0], CUDA)  # first use: checks and compiles, outside the guard
        with torch.inference_mode(), _waits_raise():
            batches = [materialize(c, CUDA) for c in cases]
            for b in batches:
                b.new_tokens(), b.row_requests()
    finally:
        fused_store.ENABLED = before
    torch.cuda.synchronize()
    for case, batch in zip(cases, batches, strict=True):
        _same_bytes(batch, materialize(case))


def test_packing_a_campaigns_launches_into_their_pools_waits_for_nothing() -> None:
    config = CampaignConfig(seed=3, pack=8, cases_per_variant=8, limits=LIMITS["cpu"])
    planned = (c for _, c in planned_cases(config, "cuda"))
    groups = [g for g in itertools.islice(packing.group_for_launches(planned, 8), 12) if len(g) > 1]
    assert len(groups) >= 4
    materialize(groups[0][0], CUDA)

    def launch(group: list[Case]) -> packing.PackedLaunch:
        # as a campaign's worker builds it: each case written into its part of the launch's
        # pool, on the device named without an index (a tensor's device always has one)
        storage, parts = packing.launch_pool(group, CUDA)
        return packing.pack(
            [materialize(c, CUDA, pool=p) for c, p in zip(group, parts, strict=True)], storage
        )

    with torch.inference_mode(), _waits_raise():
        launches = [launch(g) for g in groups]
    torch.cuda.synchronize()
    for group, launch in zip(groups, launches, strict=True):
        cpu = packing.pack([materialize(c) for c in group])
        assert torch.equal(launch.batch.block_tables.cpu(), cpu.batch.block_tables)
        assert torch.equal(launch.batch.seq_lens.cpu(), cpu.batch.seq_lens)
        raw = launch.batch.kv_storage.view(torch.uint8).cpu()
        assert torch.equal(raw, cpu.batch.kv_storage.view(torch.uint8))


@pytest.mark.parametrize("floors_fused", [True, False])
def test_the_oracle_and_its_floors_wait_for_nothing(floors_fused: bool) -> None:
    """A launch's oracle and noise floors, fused (or the floors in the torch form), on the
    stored cases and a campaign's packed launches: its lengths come from the case, so
    nothing is read back (``tests/unit/test_oracle_reads.py`` shows it on the CPU)."""
    from difftest.judgement import tolerance as compare
    from difftest.oracle import fused
    from difftest.paths.registry import Precision

    precisions = (
        Precision(p_dtype="bf16"),
        Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3"),
        Precision(p_dtype="fp32"),
    )
    cases = [Case.from_json(e["case"]) for e in json.loads(STORED.read_text())["cases"]]
    config = CampaignConfig(seed=3, pack=8, cases_per_variant=8, limits=LIMITS["cpu"])
    planned = (c for _, c in planned_cases(config, "cuda"))
    groups = [g for g in itertools.islice(packing.group_for_launches(planned, 8), 6) if len(g) > 1]
    batches = [materialize(c, CUDA) for c in cases]
    batches += [packing.pack([materialize(c, CUDA) for c in g]).batch for g in groups]
    before = fused.FLOORS_ENABLED
    fused.FLOORS_ENABLED = floors_fused
    try:
        # first use: the checks, Triton's compiles and the overflow probes, outside the guard
        for b in batches:
            compare.oracle_outputs(b, precisions, fused.batched_attention)
        assert fused.checked(CUDA) and (fused.floors_checked(CUDA) or not floors_fused)
        with torch.inference_mode(), _waits_raise():
            for b in batches:
                compare.oracle_outputs(b, precisions, fused.batched_attention)
    finally:
        fused.FLOORS_ENABLED = before
