"""Packed launches: several cases through one kernel launch, each judged as if alone."""

from __future__ import annotations

import dataclasses
import io
import math
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _planted import cpu_session, one_torch_thread  # noqa: F401  (autouse: one torch thread)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.campaign.report import CampaignReport
from difftest.execution import packing
from difftest.execution.evaluate import evaluate, evaluate_pack
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, Limits, cases, launch_partners
from difftest.interfaces.console import print_report
from difftest.judgement import tolerance as compare
from difftest.model.case import Case
from difftest.model.errors import ExitCode, FormatError
from difftest.model.outcome import Metrics, Outcome
from difftest.paths import all_paths, resolve, unregister
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import Repro, load_repro, parse_repro, write_repro

ROOT = Path(__file__).resolve().parents[2]
SLOTS_PLUGIN = str(ROOT / "tests" / "fixtures" / "launch_slots.py")
BAD_PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
WRONG_PLUGIN = str(ROOT / "tests" / "fixtures" / "wrong_path.py")
CPU_PATHS = ["torch-sdpa", "torch-paged-online"]


@pytest.fixture(name="plugin_paths")
def plugin_paths_fixture() -> Iterator[None]:
    """The fixture plugins' paths, registered in this process for one test."""
    before = {p.name for p in all_paths()}
    runpy.run_path(SLOTS_PLUGIN)
    runpy.run_path(BAD_PLUGIN)
    runpy.run_path(WRONG_PLUGIN)
    yield
    for path in all_paths():
        if path.name not in before:
            unregister(path.name)


def launches(count: int, size: int = 4, seed: int = 0) -> list[list[Case]]:
    """The first ``count`` multi-case launches a packed CPU campaign plans."""
    config = CampaignConfig(seed=seed, pack=size, cases_per_variant=2)
    planned = (case for _, case in planned_cases(config, "cpu"))
    found = []
    for group in packing.group_for_launches(planned, size):
        if len(group) > 1:
            found.append(group)
        if len(found) == count:
            return found
    raise AssertionError("the planner stopped")


def test_each_case_gets_the_same_bits_in_a_launch_as_alone() -> None:
    paths = resolve(CPU_PATHS)
    for group in launches(6):
        batches = [materialize(c) for c in group]
        launch = packing.pack(batches)
        refs = launch.split(compare.reference(launch.batch))
        for batch, ref in zip(batches, refs, strict=True):
            assert torch.equal(ref, compare.reference(batch))
        for path in paths:
            outs = launch.split(path.run(launch.batch))
            for batch, out in zip(batches, outs, strict=True):
                alone = path.run(batch)
                assert torch.equal(alone.view(torch.uint8), out.contiguous().view(torch.uint8))


def _same_figures(mine: Metrics, solo: Metrics) -> None:
    """A verdict's figures as judged alone: the maxima, bounds, counts and located errors bit
    for bit; the relative L2 error and the scale ratio, sums a launch takes over all its
    cases at once (``tolerance.agreeing``), within float64 rounding."""
    for key in ("rel_l2", "scale_ratio"):
        a, b = getattr(mine, key), getattr(solo, key)
        assert (a is None) == (b is None), key
        if a is not None and not (math.isnan(a) and math.isnan(b)):
            assert a == pytest.approx(b, rel=1e-12, abs=1e-300), key
    sums_as_alone = dataclasses.replace(mine, rel_l2=solo.rel_l2, scale_ratio=solo.scale_ratio)
    assert sums_as_alone.same_as(solo)


def test_a_launch_judges_every_case_as_evaluate_does_alone() -> None:
    paths = resolve(CPU_PATHS)
    for group in launches(3, seed=7):
        packed = evaluate_pack(group, paths, check_determinism=True)
        for case, result in zip(group, packed, strict=True):
            alone = evaluate(case, paths, check_determinism=True)
            assert result.case_digest == case.digest()
            assert [r.outcome for r in result.results] == [r.outcome for r in alone.results]
            for mine, solo in zip(result.results, alone.results, strict=True):
                assert mine.metrics.max_abs is not None
                _same_figures(mine.metrics, solo.metrics)
            # the two paths' agreement, paired for the whole launch at once: the same
            assert result.pairs == alone.pairs and len(result.pairs) == 1
            assert set(result.timings) >= {"generate", "oracle", "kernels", "compare"}


def test_the_launch_stacks_pools_and_shifts_only_used_page_ids() -> None:
    group = launches(1, seed=3)[0]
    batches = [materialize(c) for c in group]
    launch = packing.pack(batches)
    b = launch.batch
    assert b.case.batch.num_requests == sum(c.batch.num_requests for c in group)
    assert b.q.shape[0] == sum(c.batch.num_query_rows for c in group)
    assert b.block_tables.shape[1] == group[0].table_width()
    offset = row = 0
    for case, batch in zip(group, batches, strict=True):
        n = case.batch.num_requests
        for r, pages in enumerate(case.pages_per_request()):
            mine = batch.block_tables[r].long()
            packed = b.block_tables[row + r].long()
            assert torch.equal(packed[:pages], mine[:pages] + offset)
            assert torch.equal(packed[pages:], mine[pages:])  # the fill is left as it was
        pages_here = batch.kv_cache.shape[0]
        assert torch.equal(b.kv_cache[offset : offset + pages_here], batch.kv_cache)
        offset += pages_here
        row += n
    assert b.kv_cache.shape[0] == offset


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("storage", ["hnd", "nhd", "kv_split_nhd"])
def test_cases_written_into_the_launch_pool_make_the_stacked_launch(storage: str) -> None:
    """Materialised into their parts of one launch pool and one tensor of query rows (no
    copy), a launch's cases give the bytes of the launch stacked from their own pools and
    rows, each case's pool too, whatever the storage layout and whether stale slots are zeros
    or drawn."""
    found = fills = 0
    for group in launches(12, seed=5):
        group = [c.replace(pool=dataclasses.replace(c.pool, kv_storage=storage)) for c in group]
        own = [materialize(c) for c in group]
        whole, parts = packing.launch_pool(group, torch.device("cpu"))
        queries, rows = packing.launch_queries(group, torch.device("cpu"))
        whole.fill_(7)  # what an uninitialised pool may hold: it must all be overwritten
        queries.fill_(7)
        into = [
            materialize(c, pool=part, queries=q)
            for c, part, q in zip(group, parts, rows, strict=True)
        ]
        stacked, direct = packing.pack(own), packing.pack(into, whole, queries)
        assert direct.batch.kv_storage.data_ptr() == whole.data_ptr()
        assert direct.batch.q_padded.data_ptr() == queries.data_ptr()
        for name in ("kv_storage", "q_padded", "block_tables", "seq_lens"):
            a, b = getattr(stacked.batch, name), getattr(direct.batch, name)
            assert a.shape == b.shape and torch.equal(_bytes(a), _bytes(b)), name
        for a, b in zip(own, into, strict=True):
            assert torch.equal(_bytes(a.kv_storage), _bytes(b.kv_storage))
        found += 1
        fills |= {c.pool.stale_fill == "zeros" for c in group} == {True, False}
    assert found == 12 and fills  # launches with both kinds of stale fill were among them


def test_a_launch_pool_refuses_batches_that_are_not_its_parts() -> None:
    group = launches(1, seed=3)[0]
    whole, parts = packing.launch_pool(group, torch.device("cpu"))
    into = [materialize(c, pool=part) for c, part in zip(group, parts, strict=True)]
    with pytest.raises(ValueError, match="not the parts of the launch's pool"):
        packing.pack(into[::-1], whole)
    with pytest.raises(ValueError, match="not the parts of the launch's pool"):
        packing.pack(into[:-1], whole)
    with pytest.raises(ValueError, match="for a case whose pool is"):
        materialize(group[0], pool=parts[-1] if len(parts[-1]) != len(parts[0]) else whole)
    queries, rows = packing.launch_queries(group, torch.device("cpu"))
    into = [
        materialize(c, pool=part, queries=q) for c, part, q in zip(group, parts, rows, strict=True)
    ]
    with pytest.raises(ValueError, match="not the parts of the launch's, in order"):
        packing.pack(into[::-1], None, queries)
    with pytest.raises(ValueError, match="for a case whose rows are"):
        materialize(group[0], queries=queries)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(template=cases(limits=CPU_LIMITS), seed=st.integers(0, 2**32 - 1))
def test_launch_partners_can_share_the_templates_launch(template: Case, seed: int) -> None:
    partners = sample_cases(launch_partners(template, CPU_LIMITS), seed=seed, count=3)
    assert partners
    for partner in partners:
        assert packing.pack_key(partner) == packing.pack_key(template)
        assert partner.batch.padding_rows == 0
    assert packing.packable([*partners, template]) is None


def _case(**attention: object) -> Case:
    template = launches(1)[0][0]
    return template.replace(attention=dataclasses.replace(template.attention, **attention))


def test_a_launch_wide_difference_or_early_padding_rows_forbids_a_launch() -> None:
    a = _case(v_scale=1.0)
    b = _case(v_scale=2.0)
    assert "launch-wide" in (packing.packable([a, b]) or "")
    padded = a.replace(batch=dataclasses.replace(a.batch, padding_rows=3))
    assert "padding" in (packing.packable([padded, a]) or "")
    assert packing.packable([a, padded]) is None
    with pytest.raises(ValueError, match="cannot pack"):
        packing.packed_case([a, b])


def test_grouping_cuts_at_size_key_changes_and_padding_rows() -> None:
    a = _case(v_scale=1.0)
    a = a.replace(batch=dataclasses.replace(a.batch, padding_rows=0))
    b = _case(v_scale=2.0).replace(batch=a.batch)
    padded = a.replace(batch=dataclasses.replace(a.batch, padding_rows=1))
    groups = list(packing.group_for_launches([a, a, a, b, b, padded, a, padded, a], 2))
    assert groups == [[a, a], [a], [b, b], [padded], [a, padded], [a]]


def test_packed_planning_is_deterministic_and_launches_are_consecutive() -> None:
    config = CampaignConfig(seed=5, pack=3, cases_per_variant=2, max_variants=4)
    whole = list(planned_cases(config, "cpu"))
    assert whole == list(planned_cases(config, "cpu"))
    assert [i for i, _ in whole] == list(range(len(whole)))
    for group in packing.group_for_launches(whole, 3, case_of=lambda x: x[1]):
        assert packing.packable([c for _, c in group]) is None


def _run(config: CampaignConfig, paths: list[str]) -> CampaignReport:
    with cpu_session(tuple(paths)) as session:
        return run_campaign(config, session)


def test_a_packed_campaign_runs_fewer_launches_and_accounts_its_time(tmp_path: Path) -> None:
    config = CampaignConfig(seed=1, pack=4, max_cases=24, out_dir=tmp_path)
    report = _run(config, list(CPU_PATHS))
    assert report.cases == 24
    assert report.launches < report.cases
    assert report.packed_cases > 0
    assert not report.findings
    assert {"draw", "record", "generate", "oracle", "kernels", "compare"} <= set(report.timings)
    accounted = sum(report.timings.values())
    assert accounted <= report.wall_s
    log = (tmp_path / "running.jsonl").read_text().splitlines()
    assert len(log) == 2 * report.launches  # each launch noted before it ran, and done


def test_a_bug_only_a_launch_shows_is_kept_with_its_launch_and_replays(
    tmp_path: Path, plugin_paths: None
) -> None:
    # Cases of at most 6 requests each (the kernel is right on those), packed past 8.
    small = Limits(max_requests=6, max_prefix=320, long_share=0)
    config = CampaignConfig(seed=2, pack=4, max_cases=40, out_dir=tmp_path, limits=small)
    report = _run(config, ["launch-slots-8", "torch-sdpa"])
    assert report.findings, "no launch past 8 requests was planned"
    assert all(f.packed_only for f in report.findings)
    assert all(f.path == "launch-slots-8" for f in report.findings)
    assert report.paths["launch-slots-8"].outcomes == {"AGREE": report.cases}
    # Every such finding is in a packed-only group, by variant; they fail the run (exit 1)
    # and the summary lists them, though no ordinary group formed.
    assert not report.groups
    assert report.exit_code() is ExitCode.FINDINGS
    packed = report.packed_only_groups
    assert sum(g.count for g in packed) == len(report.findings)
    assert {g.variant for g in packed} == {f.variant for f in report.findings}
    assert all(g.path == "launch-slots-8" and g.kind is Outcome.WRONG for g in packed)
    first = min(report.findings, key=lambda f: f.index)
    assert packed[0].count == max(g.count for g in packed)
    assert any(g.repro == first.repro and g.first_index == first.index for g in packed)
    # the fixture is wrong past its eighth request slot: each case alone has at most 8, each
    # launch it failed in more, and the groups say so
    assert all(g.requests[1] <= 8 < g.launch_requests[0] for g in packed)
    assert all("requests): " in f.reason for f in report.findings)
    shown = io.StringIO()
    print_report(report, shown)
    text = shown.getvalue()
    assert f"{len(report.findings)} of them packed-only, in {len(packed)} group(s)" in text
    assert f"PACKED-ONLY: launch-slots-8 WRONG (tolerance): {packed[0].count} finding(s)" in text
    assert "no findings" not in text
    assert report.to_json()["packed_only_groups"] == [g.to_json() for g in packed]
    repro_file = Path(report.findings[0].repro or "")
    repro = load_repro(repro_file)
    assert len(repro.launch) >= 2 and repro.case in repro.launch
    assert "only in a launch of" in (repro.finding.reason if repro.finding else "")
    with cpu_session(("launch-slots-8",)) as session:
        [again] = replay_repro(repro, session, source=str(repro_file))
        assert again.verdict is Verdict.STILL_FAILS
        alone = dataclasses.replace(repro, launch=())
        [solo] = replay_repro(alone, session, source=str(repro_file))
        assert solo.verdict is Verdict.FIXED


def test_a_finding_in_a_launch_is_confirmed_alone_and_kept_as_a_single_case(
    tmp_path: Path, plugin_paths: None
) -> None:
    config = CampaignConfig(seed=3, pack=3, max_cases=30, out_dir=tmp_path)
    report = _run(config, ["wrong-long-prefix"])
    assert report.packed_cases and report.findings
    for finding in report.findings:
        assert not finding.packed_only
    for group in report.groups:
        assert group.minimal is not None and not load_repro(group.minimal).launch


def test_the_isolated_worker_runs_a_launch_and_blames_a_crash_on_its_case(
    plugin_paths: None,
) -> None:
    group = launches(1, size=3, seed=4)[0]
    paths = resolve(["torch-sdpa", "bad-abort"])
    deadline = Deadline(base_s=20.0, cold_s=0.0, grace_s=0.5)
    with IsolatedExecutor(paths, "cpu", plugins=[BAD_PLUGIN], deadline=deadline) as executor:
        results = executor.evaluate_pack(group)
        assert executor.replacements >= len(group)  # the launch's worker, then one per case
    for case, result in zip(group, results, strict=True):
        assert result.case_digest == case.digest()
        assert result.result_for("torch-sdpa").outcome is Outcome.AGREE  # type: ignore[union-attr]
        assert result.result_for("bad-abort").outcome is Outcome.CRASH  # type: ignore[union-attr]
    good = resolve(["torch-sdpa"])
    with IsolatedExecutor(good, "cpu", deadline=deadline) as executor:
        isolated = executor.evaluate_pack(group)
        assert executor.replacements == 0
    for result, packed in zip(isolated, evaluate_pack(group, good), strict=True):
        assert [(r.outcome, r.metrics) for r in result.results] == [
            (r.outcome, r.metrics) for r in packed.results
        ]
        assert "isolation" in result.timings


def test_a_repro_launch_is_validated_when_loaded(tmp_path: Path) -> None:
    group = launches(1, seed=6)[0]
    repro = Repro(case=group[0], launch=tuple(group), status="running", paths=("torch-sdpa",))
    data = repro.to_json()
    assert parse_repro(data, "x").launch == tuple(group)
    with pytest.raises(FormatError, match="at least two"):
        parse_repro({**data, "launch": data["launch"][:1]}, "x")
    other = group[1].replace(seed=group[1].seed ^ 1)
    stranger = {**data, "case": other.to_json()}
    if other not in group:
        with pytest.raises(FormatError, match="does not contain"):
            parse_repro(stranger, "x")
    file = write_repro(tmp_path, repro)
    assert load_repro(file).launch == tuple(group)


def test_a_launch_ends_before_it_would_hold_more_than_one_case_may() -> None:
    """At the GPU limits eight large cases of one variant once made a launch whose pool the
    case model refuses (4.97 G elements against its cap of 2**32): the campaign then ended
    with "invalid case". Now the launch ends before the case that would overfill it."""
    from difftest.model.caps import MAX_POOL_ELEMENTS
    from difftest.model.case import AttentionConfig, BatchSpec, Case

    attention = AttentionConfig(num_qo_heads=4, num_kv_heads=4, head_dim=128, page_size=32)
    per_token = 2 * attention.num_kv_heads * attention.head_dim
    tokens = MAX_POOL_ELEMENTS // per_token * 2 // 5  # two fit in one pool, three do not
    big = [
        Case(
            attention=attention,
            batch=BatchSpec(mode="target_verify", prefix_lens=(tokens // 40,) * 40, q_len=2),
            seed=seed,
        )
        for seed in range(5)
    ]
    launches = list(packing.group_for_launches(big, 8))
    assert [len(g) for g in launches] == [2, 2, 1]
    for group in launches:
        assert packing.fits_one_launch(group)
        packing.packed_case(group)  # the case model takes every launch
    assert not packing.fits_one_launch(big[:3])
    small = [
        dataclasses.replace(c, batch=dataclasses.replace(c.batch, prefix_lens=(5, 9))) for c in big
    ]
    assert [len(g) for g in packing.group_for_launches(small, 8)] == [5]


def test_a_launch_is_split_before_the_case_that_would_take_its_pool_past_the_bound() -> None:
    """A pooled GPU campaign bounds a launch's pool by its workers' memory share
    (``Session.launch_pool_bytes``): launches of pools past the share ran out of memory and
    then ran every case alone (docs/validation.md, Run 47). Cases of 1, 2, 3 and 4 requests'
    pools, bounded at the first three's: the fourth starts a launch; a case past the bound
    alone still goes, alone; no bound, one launch."""
    template = _case()
    cases = [
        template.replace(batch=dataclasses.replace(template.batch, prefix_lens=(64,) * n))
        for n in (1, 2, 3, 4)
    ]
    each = [packing.pool_bytes([c]) for c in cases]
    assert 0 < each[0] < each[1] < each[2] < each[3]  # a pool grows with its requests
    bound = sum(each[:3])
    launches = list(packing.group_for_launches(cases, 8, max_pool_bytes=bound))
    assert launches == [cases[:3], cases[3:]]
    assert all(packing.pool_bytes(g) <= bound for g in launches)
    assert list(packing.group_for_launches(cases, 8, max_pool_bytes=each[0] // 2)) == [
        [c] for c in cases
    ]  # each alone, none dropped
    assert list(packing.group_for_launches(cases, 8)) == [cases]


def test_the_bound_on_a_launch_pool_is_a_share_of_a_pool_workers_memory_on_a_gpu_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from difftest.execution.isolation.early import LAUNCH_POOL_SHARE, pool_memory_share

    with cpu_session(("torch-sdpa",), isolation="process") as session:
        assert session.launch_pool_bytes(8) is None  # a CPU: no worker keeps to a share
        gpu = torch.device("cuda", 0)
        monkeypatch.setattr(session, "device", gpu)
        monkeypatch.setattr(
            torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": 80e9})
        )
        share = pool_memory_share(8, gpu)
        assert share is not None
        assert session.launch_pool_bytes(8) == int(LAUNCH_POOL_SHARE * share * 80e9)
        assert session.launch_pool_bytes(1) is None  # one worker: the whole device, no share
    with cpu_session(("torch-sdpa",)) as session:  # in-process: no worker, no share
        monkeypatch.setattr(session, "device", torch.device("cuda", 0))
        assert session.launch_pool_bytes(8) is None


_OOM_PLUGIN = """
import os
import torch
from difftest.execution import bounds

real = bounds.oracle_and_bounds
failed = []


def planted(members, launch, dev, tol, **kw):
    # a launch of {fails_from} cases or more does not fit; at most {times} failures in all
    if len(members) >= {fails_from} and len(failed) < {times}:
        failed.append(len(members))
        raise {error}({message!r})
    return real(members, launch, dev, tol, **kw)


bounds.oracle_and_bounds = planted
"""

TORCH_OOM = ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 7.98 GiB (planted)")
TRITON_OOM = ("RuntimeError", "Triton Error [CUDA]: out of memory")
"""What a Triton kernel's launch raised in a worker when eight workers shared an H200 (Run 27)."""


def _oom_plugin(
    tmp_path: Path, error: tuple[str, str], fails_from: int, times: int = 1 << 30
) -> str:
    plugin = tmp_path / "oom_plugin.py"
    name, message = error
    plugin.write_text(
        _OOM_PLUGIN.format(error=name, message=message, fails_from=fails_from, times=times)
    )
    return str(plugin)


@pytest.mark.parametrize(
    "error",
    [TORCH_OOM, TRITON_OOM, ("ValueError", "CUDA out of memory (planted, but not an allocation)")],
    ids=["torch", "triton", "other"],
)
def test_a_launch_that_runs_the_worker_out_of_memory_is_judged_case_by_case(
    tmp_path: Path, error: tuple[str, str]
) -> None:
    """A packed launch too large for the device's memory (an H200 worker asked for 7.98 GiB
    in the oracle; a Triton kernel's launch found no memory when eight workers shared the
    device) is no bug: its cases are judged alone, each getting the verdict it gets alone.
    Any other error inside the worker is still difftest's bug, reported as one, whatever its
    message says."""
    from difftest.execution.isolation import RemoteError

    plugin = _oom_plugin(tmp_path, error, fails_from=2)
    group = launches(1, seed=6)[0]
    paths = resolve(CPU_PATHS)
    with IsolatedExecutor(paths, "cpu", plugins=[plugin]) as executor:
        if error[0] == "ValueError":
            with pytest.raises(RemoteError) as raised:
                executor.evaluate_pack(group)
            assert not raised.value.out_of_memory and raised.value.exception == "ValueError"
            return
        results = executor.evaluate_pack(group)
    alone = [evaluate(c, paths) for c in group]
    assert [r.case_digest for r in results] == [c.digest() for c in group]
    for got, want in zip(results, alone, strict=True):
        assert [(r.path, r.outcome, r.metrics) for r in got.results] == [
            (r.path, r.outcome, r.metrics) for r in want.results
        ]


def test_a_case_short_of_memory_once_is_run_again(tmp_path: Path) -> None:
    """One case that found no memory once (another worker held it) is run again, once, by the
    worker that gave its cache back: its verdict is the one it gets alone."""
    plugin = _oom_plugin(tmp_path, TRITON_OOM, fails_from=1, times=1)
    case = launches(1, seed=6)[0][0]
    paths = resolve(CPU_PATHS)
    with IsolatedExecutor(paths, "cpu", plugins=[plugin]) as executor:
        got = executor.evaluate(case)
    want = evaluate(case, paths)
    assert [(r.path, r.outcome, r.metrics) for r in got.results] == [
        (r.path, r.outcome, r.metrics) for r in want.results
    ]


def test_a_case_that_never_fits_is_a_clear_error_not_a_bug(tmp_path: Path) -> None:
    """A case that runs its worker out of memory twice does not fit here: a one-line
    :class:`DifftestError` (exit 2 on the command line) that names the case and what to
    change, not an internal error with a traceback."""
    from difftest.execution.isolation import DeviceMemoryError
    from difftest.model.errors import DifftestError

    plugin = _oom_plugin(tmp_path, TRITON_OOM, fails_from=1)
    case = launches(1, seed=6)[0][0]
    with IsolatedExecutor(resolve(CPU_PATHS), "cpu", plugins=[plugin]) as executor:
        with pytest.raises(DeviceMemoryError) as raised:
            executor.evaluate(case)
    assert isinstance(raised.value, DifftestError)
    message = str(raised.value)
    assert "\n" not in message
    assert case.digest() in message and "out of memory" in message
    assert "fewer workers on the device (--workers, pytest -n)" in message
