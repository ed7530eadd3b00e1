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
from hypothesis import given, settings
from hypothesis import strategies as st
from test_generation_bits import _stored, batch_digests

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.execution.op_census import Census
from difftest.generation import fused_store, materialize, placement, rng, values
from difftest.generation.strategies import LIMITS
from difftest.machine import host_copy
from difftest.model.case import Case

INT64 = np.iinfo(np.int64)

EXPANDED = ("key_req", "token", "slot", "stale", "outlier_factor")
"""The device plan's per-token tensors: expanded from the runs on the device (and the outlier
factors hashed there), not copied."""


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
    Triton's specialisations see the alignment). The per-token tensors, expanded from the
    runs on the device (and the outlier factors hashed there), are the ones numpy computes on
    the host."""
    monkeypatch.setattr(rng, "NUMPY_ON_CPU", False)  # the device's hash: torch's operations
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
            for name, t in vars(copied).items()
            if t is not None and t.numel() and name not in EXPANDED
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
                if got.numel() and name not in EXPANDED:
                    buffers.add(got.untyped_storage().data_ptr())
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


def _token_by_token(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The plan's stored tokens as it was computed until Run 32, one element a token: each
    live token's request (``-1`` for a shared prefix token, kept once, with request 0's),
    position and slot, in token order, and the pool's free slots, ascending."""
    b, pool, ps = case.batch, case.pool, case.attention.page_size
    seq_lens = np.asarray(b.seq_lens(), dtype=np.int64)
    table = placement.page_table(case)
    req = np.repeat(np.arange(seq_lens.size), seq_lens)
    tok = np.concatenate([np.arange(n) for n in seq_lens])
    in_shared = (tok < pool.shared_prefix_pages * ps) & (req < len(b.prefix_lens))
    once = ~in_shared | (req == 0)
    req, tok, in_shared = req[once], tok[once], in_shared[once]
    slot = table[req, tok // ps] * ps + tok % ps
    stale = None
    if pool.stale_fill != "zeros":
        free = np.ones(case.num_pages() * ps, dtype=bool)
        free[slot] = False
        stale = np.flatnonzero(free)
    return np.where(in_shared, -1, req), tok, slot, stale


def _varied_cases() -> list[Case]:
    cases = _cases()
    for limits, seed in (("cpu", 1), ("cpu", 2), ("small", 3), ("gpu", 4)):
        config = CampaignConfig(seed=seed, pack=1, cases_per_variant=4, limits=LIMITS[limits])
        cases += [c for _, c in itertools.islice(planned_cases(config, "cpu"), 60)]
    return cases


def test_the_runs_expanded_are_the_token_by_token_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each live run is one request's tokens in one page, each stale run the rest of a page:
    expanded on the host (numpy) and on the device's route (one copy, the launch's runs
    expanded by tensor operations), they are the per-token plan, element for element, on the
    stored cases and a few hundred planned ones of every limits (shared prefixes, partial
    pages, every page order and stale fill among them); so are the outlier factors hashed on
    the device's route for a launch's outlier cases together."""
    cases = _varied_cases()
    seen = {
        "shared": any(c.pool.shared_prefix_pages and c.batch.num_requests > 1 for c in cases),
        "stale": any(c.pool.stale_fill != "zeros" for c in cases),
        "zeros": any(c.pool.stale_fill == "zeros" for c in cases),
        "shuffled": any(c.pool.page_order == "shuffled" for c in cases),
        "spare": any(c.pool.spare_pages for c in cases),
        "partial": any(t % c.attention.page_size for c in cases for t in c.batch.seq_lens()),
    }
    assert all(seen.values()), seen
    plans = [placement.place(c) for c in cases]
    for case, plan in zip(cases, plans, strict=True):
        key_req, tok, slot, stale = _token_by_token(case)
        assert (plan.run_len >= 1).all() and (plan.run_len <= case.attention.page_size).all()
        for mine, theirs in zip(plan.tokens(), (key_req, tok, slot), strict=True):
            assert mine.dtype == np.int64 and np.array_equal(mine, theirs), case.digest()
        got = plan.stale()
        assert (got is None) == (stale is None)
        assert got is None or np.array_equal(got, stale), case.digest()
    monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", True)
    monkeypatch.setattr(rng, "NUMPY_ON_CPU", False)  # the device's hash: torch's operations
    mixed = outliers = 0
    for at in range(0, len(cases), 8):
        launch = placement.on_device(plans[at : at + 8], torch.device("cpu"))
        families = {c.values.family == "outlier_tokens" for c in cases[at : at + 8]}
        mixed += families == {True, False}
        for case, device in zip(cases[at : at + 8], launch, strict=True):
            key_req, tok, slot, stale = _token_by_token(case)
            for name, theirs in (("key_req", key_req), ("token", tok), ("slot", slot)):
                mine = getattr(device, name)
                assert mine.dtype == torch.int64 and np.array_equal(mine.numpy(), theirs), name
            assert (device.stale is None) == (stale is None)
            assert device.stale is None or np.array_equal(device.stale.numpy(), stale)
            factor = device.outlier_factor
            if case.values.family != "outlier_tokens":
                assert factor is None
                continue
            theirs = values.outlier_factors(values.outlier_key(case.seed), key_req, tok)
            assert factor is not None and factor.dtype == torch.float64
            assert np.array_equal(factor.numpy(), theirs)
            outliers += int((theirs == 16.0).sum())
    assert outliers >= 10
    assert mixed >= 3  # launches whose outlier plans' tokens come first, hashed together


def _page_table_whole(case: Case) -> np.ndarray:
    """The page table as it was computed until Run 32: every entry of ``[bs, W]`` as a used
    page's and as the fill's, then one chosen, with the stable sort's page order."""
    b, pool = case.batch, case.pool
    bs, width = b.num_requests, case.table_width()
    pages = np.asarray(case.pages_per_request(), dtype=np.int64)
    shared_b = np.where(np.arange(bs) < len(b.prefix_lens), pool.shared_prefix_pages, 0)
    own = pages - shared_b
    first_own = pool.shared_prefix_pages + np.cumsum(own) - own
    col = np.arange(width, dtype=np.int64).reshape(1, -1)
    logical = np.where(col < shared_b[:, None], col, first_own[:, None] + col - shared_b[:, None])
    used = col < pages[:, None]
    ids = np.arange(case.num_pages(), dtype=np.int64)
    order = {"sequential": ids, "reversed": ids[::-1]}.get(pool.page_order)
    if order is None:
        h = rng.host_hash(rng.key(case.seed, rng.Stream.PAGE_ORDER), ids)
        order = np.argsort(h, kind="stable")
    physical = order[np.where(used, logical, 0)]
    if pool.table_fill == "zero":
        filler = np.zeros_like(physical)
    elif pool.table_fill == "stale_pages":
        rows = np.arange(bs, dtype=np.int64).reshape(-1, 1)
        h = rng.host_hash(rng.key(case.seed, rng.Stream.STALE_PAGES), rows, col)
        filler = np.remainder(h, case.num_pages())
    else:
        filler = np.broadcast_to(placement.OUT_OF_RANGE_BASE + col, (bs, width))
    return np.where(used, physical, filler)


def test_the_page_table_is_the_whole_table_computation() -> None:
    """The page table, written over its fill at the used columns only, is the one computed
    entry by entry, on every fill and page order."""
    cases = _varied_cases()
    assert {c.pool.table_fill for c in cases} == {"zero", "stale_pages", "out_of_range"}
    for case in cases:
        table = placement.page_table(case)
        assert table.dtype == np.int64 and np.array_equal(table, _page_table_whole(case))


def test_the_page_order_is_the_stable_sorts_and_the_table_is_read_only() -> None:
    """The shuffled page order, found by numpy's default sort, is the stable sort's (the
    hashes are distinct); the kept page table cannot be written by a caller."""
    for case in _varied_cases():
        if case.pool.page_order != "shuffled":
            continue
        ids = np.arange(case.num_pages(), dtype=np.int64)
        h = rng.host_hash(rng.key(case.seed, rng.Stream.PAGE_ORDER), ids)
        assert np.array_equal(placement.page_permutation(case), np.argsort(h, kind="stable"))
    table = placement.page_table(_cases()[0])
    with pytest.raises(ValueError, match="read-only"):
        table[0, 0] = 1


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
    st.lists(st.integers(-4, 4), max_size=300),
    st.integers(0, 3),
)
def test_the_page_orders_sort_is_numpys_stable_argsort(
    wide: list[int], narrow: list[int], low_bits: int
) -> None:
    """:func:`placement.stable_order` is ``np.argsort(kind="stable")`` in signed order,
    including values whose upper 32 bits are equal (ordered by their lower bits) and values
    equal in all 64 (in index order): small upper halves shifted into place, with a few
    distinct low bits, force both, beside arbitrary 64-bit values."""
    upper = np.asarray(narrow, dtype=np.int64) << 32
    lower = np.arange(upper.size, dtype=np.int64) % (low_bits + 1)
    h = np.concatenate([np.asarray(wide, dtype=np.int64), upper | lower])
    order = placement.stable_order(h)
    assert order.dtype == np.int64
    assert np.array_equal(order, np.argsort(h, kind="stable"))


@settings(max_examples=100, deadline=None)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20),
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20),
)
def test_a_host_hash_goes_on_from_hashes_already_folded(
    key: int, first: list[int], second: list[int]
) -> None:
    """``host_hash(host_hash(k, a)[rows], b)`` is ``host_hash(k, a[rows], b)``: the page
    table's stale fill hashes each row once and goes on from it per column."""
    a, b = np.asarray(first, dtype=np.int64), np.asarray(second, dtype=np.int64)
    rows = np.arange(b.size) % a.size
    folded = rng.host_hash(key, a)
    assert np.array_equal(rng.host_hash(folded[rows], b), rng.host_hash(key, a[rows], b))
    grid = rng.host_hash(key, a.reshape(-1, 1), b.reshape(1, -1))
    assert np.array_equal(rng.host_hash(folded.reshape(-1, 1), b.reshape(1, -1)), grid)
