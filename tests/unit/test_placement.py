"""A case's integer plan is computed on the host and reaches the device in one copy.

The plan (page table, token slots, stale slots, query rows, draft mask, outlier factors, the
near-ties base, the sinks) was computed by tensor operations on the target device; on a GPU
about ninety a case, eight of them waits for the device. Now it is numpy on the host
(:mod:`difftest.generation.placement`). These tests hold it to the same bits (the stored
cases' digests, each route), to the host hashes being the device hashes, and to generation's
GPU route issuing no operation that waits for the device.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np
import pytest
import torch
from test_generation_bits import _stored, batch_digests

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.execution.op_census import Census
from difftest.generation import fused_store, materialize, placement, rng
from difftest.generation.strategies import LIMITS
from difftest.machine import host_copy
from difftest.model.case import Case

INT64 = np.iinfo(np.int64)


def _cases() -> list[Case]:
    return [Case.from_json(e["case"]) for e in _stored()]


def test_host_hashes_are_the_devices_bit_for_bit() -> None:
    gen = np.random.default_rng(5)
    edge = np.array([0, 1, -1, INT64.min, INT64.max, 1 << 53, -(1 << 40)], dtype=np.int64)
    a = np.concatenate([edge, gen.integers(INT64.min, INT64.max, 500, dtype=np.int64)])
    b = gen.integers(-(1 << 20), 1 << 20, a.size, dtype=np.int64)
    for key in (0, 12345, -(1 << 62) + 17, rng.key(7, rng.Stream.OUTLIER)):
        host = rng.host_hash(key, a.reshape(-1, 1), b.reshape(1, -1)[:, :40])
        device = rng.hash_coords(
            torch.tensor(key, dtype=torch.int64),
            torch.from_numpy(a).view(-1, 1),
            torch.from_numpy(b[:40]).view(1, -1),
        )
        assert np.array_equal(host, device.numpy())
        flat = host.reshape(-1)
        t = torch.from_numpy(flat.copy())
        assert np.array_equal(rng.host_uniform(flat), rng.uniform(t).numpy())
        assert np.array_equal(
            rng.host_std_normal(flat).view(np.int64), rng.std_normal(t).numpy().view(np.int64)
        )


def test_the_plan_is_what_the_batch_would_build_itself() -> None:
    """The row layouts handed to the batch are the ones it builds from its case alone."""
    for case in _cases():
        batch = materialize.materialize(case)
        counts = torch.tensor(case.batch.new_tokens(), dtype=torch.int64)
        assert torch.equal(batch.new_tokens(), counts)
        rows = torch.repeat_interleave(torch.arange(case.batch.num_requests), counts)
        assert torch.equal(batch.row_requests(), rows)
        assert batch.row_requests().dtype == batch.new_tokens().dtype == torch.int64


def test_a_batch_refuses_a_layout_it_does_not_have() -> None:
    batch = materialize.materialize(_cases()[0])
    with pytest.raises(ValueError, match="not a row layout"):
        batch.knowing(frame_rows=torch.zeros(1))


def test_one_copy_gives_the_arrays_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's route (one byte buffer, typed views of it) on a CPU: every array, dtype and
    shape as the host computed it, no part overlapping another, each starting 256 bytes
    into the buffer or a multiple of it (as a fresh device allocation would: kernels and
    Triton's specialisations see the alignment)."""
    for case in _cases():
        plan = placement.place(case)
        views = plan.on(torch.device("cpu"))
        monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", True)
        copied = plan.on(torch.device("cpu"))
        monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", False)
        for name, theirs in vars(views).items():
            mine = getattr(copied, name)
            if theirs is None:
                assert mine is None
                continue
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
            assert torch.equal(mine, theirs), name
        starts = sorted(
            (t.untyped_storage().data_ptr(), t.storage_offset() * t.element_size(), t.nbytes)
            for t in vars(copied).values()
            if t is not None and t.numel()
        )
        assert len({ptr for ptr, _, _ in starts}) == 1  # one buffer
        assert all(off % host_copy.ALIGN == 0 for _, off, _ in starts)
        ends = [off + n for _, off, n in starts]
        assert all(off >= end for (_, off, _), end in zip(starts[1:], ends, strict=False))


def test_a_launchs_plans_go_in_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed launch's cases' plans reach the device together (one buffer, one copy): each
    case's tensors are those of its own plan moved alone."""
    cases = _cases()[:6]
    plans = [placement.place(c) for c in cases]
    alone = [p.on(torch.device("cpu")) for p in plans]
    monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", True)
    together = placement.on_device(plans, torch.device("cpu"))
    buffers = set()
    for mine, theirs in zip(together, alone, strict=True):
        for name, value in vars(theirs).items():
            got = getattr(mine, name)
            assert (got is None) == (value is None), name
            if value is not None:
                assert got.dtype == value.dtype and torch.equal(got, value), name
                buffers |= {got.untyped_storage().data_ptr()} if got.numel() else set()
    assert len(buffers) == 1


@pytest.mark.parametrize("one_copy", [False, True])
def test_the_gpu_route_gives_the_stored_bits(
    one_copy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation as on a CUDA device with Triton (each store one call, stood in for by its
    torch form; the plan by one copy or as views) gives every stored case's digests."""
    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(
        fused_store, "launch", functools.partial(fused_store.one_by_one, materialize._store_torch)
    )
    monkeypatch.setattr(fused_store, "_checked", True)
    monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", one_copy)
    for entry in _stored():
        case = Case.from_json(entry["case"])
        assert batch_digests(materialize.materialize(case)) == entry["digests"], case.digest()


@pytest.mark.parametrize("fused", [True, False])
def test_generation_and_packing_never_wait_for_the_device(
    fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU's route, with Triton (each store one kernel) or without (the torch form on the
    device), materialising and packing issue no operation that makes the host wait for the
    device (before: a tensor from a host list, boolean indexes, ``nonzero`` and
    ``repeat_interleave`` in every case)."""
    census = Census()

    def kernel(segments: Any) -> None:  # one launch on a GPU: its torch form's work not counted
        census.counts["the kernel"] += 1
        before, census.part = census.part, None
        try:
            fused_store.one_by_one(materialize._store_torch, segments)
        finally:
            census.part = before

    monkeypatch.setattr(fused_store, "usable", lambda device: fused)
    monkeypatch.setattr(fused_store, "launch", kernel)
    monkeypatch.setattr(fused_store, "_checked", True)
    monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", True)
    monkeypatch.setattr(rng, "NUMPY_ON_CPU", False)  # numpy hashes only on a CPU
    planned = CampaignConfig(seed=3, pack=4, cases_per_variant=8, limits=LIMITS["cpu"])
    launches = itertools.islice(
        packing.group_for_launches((c for _, c in planned_cases(planned, "cpu")), 4), 6
    )
    groups = [g for g in launches if len(g) > 1]
    assert len(groups) >= 3  # packing is reached
    with torch.inference_mode(), census:
        for case in _cases():
            batch = materialize.materialize(case)
            batch.new_tokens(), batch.row_requests()
        for group in groups:
            packing.pack([materialize.materialize(c) for c in group])
            # as a launch is materialised: into its pool and query rows, its stores together
            storage, pools = packing.launch_pool(group, torch.device("cpu"))
            queries, rows = packing.launch_queries(group, torch.device("cpu"))
            with materialize.stores_together():
                batches = [
                    materialize.materialize(c, pool=pool, queries=q)
                    for c, pool, q in zip(group, pools, rows, strict=True)
                ]
            packing.pack(batches, storage, queries)
    kernels = census.counts["the kernel"]
    assert (kernels >= 3 * len(_cases()) if fused else kernels == 0) and census.counts["other"]
    assert not census.waiting_ops, dict(census.waiting_ops)
