"""Compile behind execution: the next variants' builds run in other processes while a
variant's cases run, cases wait only for their own modules, the wait is reported apart, and a
build that kills its process costs that variant a CRASH, not the command.

The "builds" are the ``slow_build`` fixture's, controlled by files: nothing here depends on
how fast anything runs (the polling deadlines are a safety net for a broken build, not
measurements).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from _planted import cpu_session, one_torch_thread  # noqa: F401  (autouse: one torch thread)

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, Planner, planned_cases
from difftest.execution.compile_ahead import CompileAhead
from difftest.model.outcome import Outcome
from difftest.paths import get_path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "slow_build.py")
SAFETY_S = 120.0
"""How long the test waits for a thing it expects before it fails (never reached when the
code works: the builds it waits for do nothing but wait for the test)."""


def _variant_id(case: object) -> str:
    import hashlib

    return hashlib.sha256(repr(case.compile_variant()).encode()).hexdigest()[:12]  # type: ignore[attr-defined]


def _until(condition, what: str) -> float:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until true; the monotonic time it was seen true."""
    limit = time.monotonic() + SAFETY_S
    while not condition():
        if time.monotonic() > limit:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)
    return time.monotonic()


def _fake_build_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder through which the test controls the ``slow_build`` fixture's builds."""
    folder = tmp_path / "builds"
    folder.mkdir()
    monkeypatch.setenv("DIFFTEST_FAKE_BUILD_DIR", str(folder))
    return folder


def _ran(folder: Path) -> list[str]:
    log = folder / "ran.log"
    return log.read_text().split() if log.exists() else []


def test_later_builds_go_on_while_a_variant_runs_and_the_wait_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = CampaignConfig(
        seed=3,
        max_cases=6,
        cases_per_variant=2,
        compile_ahead=2,
        shrink=False,
        determinism_every=0,
        out_dir=tmp_path / "out",
    )
    planned = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 6)]
    variants = list(dict.fromkeys(_variant_id(c) for c in planned))
    assert len(variants) >= 2, "the plan must span two variants for this test to mean anything"
    first, second = variants[0], variants[1]
    seen: dict[str, object] = {}

    def control() -> None:
        try:
            t_first = _until(lambda: (folder / f"{first}.started").exists(), "build 1 started")
            _until(lambda: (folder / f"{second}.started").exists(), "build 2 started")
            # both builds run side by side, and no case has run: the first waits for its module
            seen["ran_before_release"] = _ran(folder)
            time.sleep(0.3)
            seen["held_s"] = time.monotonic() - t_first
            (folder / f"{first}.release").write_text("")
            _until(lambda: first in _ran(folder), "a case of variant 1 ran")
            # the first variant's cases run while the second's build is still in flight
            seen["second_built_while_first_ran"] = (folder / f"{second}.built").exists()
        except AssertionError as e:
            seen["error"] = str(e)
        finally:
            (folder / "release-all").write_text("")

    controller = threading.Thread(target=control)
    controller.start()
    with cpu_session(("blocking-build",), plugins=(PLUGIN,)) as session:
        report = run_campaign(config, session)
    controller.join()
    assert "error" not in seen, seen.get("error")
    assert seen["ran_before_release"] == []
    assert seen["second_built_while_first_ran"] is False
    # every case ran, in plan order, each after its own variant's build
    assert report.cases == 6
    assert _ran(folder) == [_variant_id(c) for c in planned]
    assert report.paths["blocking-build"].outcomes == {"AGREE": 6}
    ahead = report.compile_ahead
    assert ahead is not None and ahead.processes == 2 and ahead.failed == ()
    assert ahead.builds + ahead.unfinished >= len(variants)
    # the wait covers at least the time the test held build 1 after it had started
    waited = report.timings["compile_wait"]
    assert float(seen["held_s"]) <= waited <= report.wall_s  # type: ignore[arg-type]
    as_json = report.to_json()
    assert as_json["timings"]["compile_wait"] == round(waited, 3)
    assert as_json["compile_ahead"]["builds"] == ahead.builds


def test_a_build_that_kills_its_process_is_that_variants_crash_not_the_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_build_folder(tmp_path, monkeypatch)
    config = CampaignConfig(
        seed=5,
        max_cases=2,
        compile_ahead=1,
        shrink=False,
        determinism_every=0,
        out_dir=tmp_path / "out",
    )
    with cpu_session(
        ("torch-sdpa", "crashing-build"), plugins=(PLUGIN,), isolation="process"
    ) as session:
        report = run_campaign(config, session)
    assert report.cases == 2
    assert report.paths["torch-sdpa"].outcomes == {"AGREE": 2}
    crashing = report.paths["crashing-build"]
    assert crashing.outcomes.get(Outcome.CRASH.value, 0) >= 1
    assert any(f.kind is Outcome.CRASH and "SIGKILL" in f.reason for f in report.findings)
    ahead = report.compile_ahead
    assert ahead is not None and ahead.failed
    assert all("crashing-build" in line and "SIGKILL" in line for line in ahead.failed)


def test_cases_wait_only_for_their_own_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module never submitted is not waited for, and one already built costs no build."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    from difftest.paths import load_plugin

    load_plugin(PLUGIN)
    path = get_path("blocking-build")
    cases = [c for _, c in itertools.islice(planned_cases(CampaignConfig(seed=1), "cpu"), 4)]
    import torch

    with CompileAhead([path], torch.device("cpu"), processes=1, plugins=(PLUGIN,)) as ahead:
        assert ahead.wait_for(cases[:1]) >= 0.0  # nothing submitted: returns
        assert ahead.submit(cases[:1]) == 1
        assert ahead.submit(cases[:1]) == 0  # one build per module
        (folder / "release-all").write_text("")
        ahead.wait_for(cases[:1])
        assert [r.error for r in ahead.results] == [""]
        assert (folder / f"{_variant_id(cases[0])}.built").exists()
    # a plugin the build process cannot load: a failed build, reported in one line
    with CompileAhead([path], torch.device("cpu"), processes=1, plugins=("no_such_mod",)) as bad:
        bad.submit(cases[1:2])
        bad.wait_for(cases[1:2])
        [result] = bad.results
        assert result.error.splitlines() == [result.error] and "no_such_mod" in result.error


def _deferring_config(tmp_path: Path, max_cases: int) -> CampaignConfig:
    return CampaignConfig(
        seed=3,
        max_cases=max_cases,
        cases_per_variant=max_cases,
        compile_ahead=1,
        patience_s=0.0,  # past it at once: the test holds the build
        shrink=False,
        determinism_every=0,
        out_dir=tmp_path / "out",
    )


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_path_still_building_judges_later_and_the_others_go_ahead(
    isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slow module (FMHAv2's takes minutes) holds up its own path only: the ready path
    runs every case while the build is held, and the slow path judges them all once built."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = _deferring_config(tmp_path, 4)
    seen: list[tuple[int, bool]] = []

    def progress(cases: int, findings: int, groups: int, elapsed: float) -> None:
        seen.append((cases, any(folder.glob("*.built"))))
        if cases == 4:
            (folder / "release-all").write_text("")

    try:
        with cpu_session(
            ("torch-sdpa", "blocking-build"), plugins=(PLUGIN,), isolation=isolation
        ) as session:
            report = run_campaign(config, session, progress=progress)
    finally:
        (folder / "release-all").write_text("")
    # torch-sdpa ran all four cases before the build was let go; nothing ran on the slow path
    assert seen == [(1, False), (2, False), (3, False), (4, False)]
    assert report.cases == 4
    assert report.paths["torch-sdpa"].outcomes == {"AGREE": 4}
    assert report.paths["blocking-build"].outcomes == {"AGREE": 4}
    assert len(_ran(folder)) == 4  # each case once on the slow path, after its build
    ahead = report.compile_ahead
    assert ahead is not None
    assert ahead.judged_later == {"blocking-build": 4} and ahead.never_judged == {}
    assert report.to_json()["compile_ahead"]["judged_later"] == {"blocking-build": 4}


def test_when_no_path_is_ready_the_first_build_to_end_lets_the_launch_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the patience with every path still building (Run 12 on the H200: four cold
    modules under load, and a campaign that waited its whole budget for the slowest): the
    launch runs on the first path whose module is built, not after the last."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = dataclasses.replace(_deferring_config(tmp_path, 4), compile_ahead=2)
    [vid] = {_variant_id(c) for _, c in itertools.islice(planned_cases(config, "cpu"), 4)}
    ran_first: list[bool] = []

    def control() -> None:
        try:
            _until(lambda: (folder / f"{vid}.started").exists(), "the first path's build began")
            _until(lambda: (folder / f"b-{vid}.started").exists(), "the second path's build began")
            (folder / f"{vid}.release").write_text("")  # the first path's module only
            limit = time.monotonic() + SAFETY_S
            while time.monotonic() < limit and vid not in _ran(folder):
                time.sleep(0.02)
            ran_first.append(vid in _ran(folder) and not (folder / f"b-{vid}.built").exists())
        finally:
            (folder / "release-all").write_text("")

    thread = threading.Thread(target=control)
    thread.start()
    try:
        with cpu_session(("blocking-build", "blocking-build-b"), plugins=(PLUGIN,)) as session:
            report = run_campaign(config, session)
    finally:
        (folder / "release-all").write_text("")
        thread.join()
    assert ran_first == [True]  # cases ran on the first path while the second still built
    assert report.cases == 4
    assert report.paths["blocking-build"].outcomes == {"AGREE": 4}
    assert report.paths["blocking-build-b"].outcomes == {"AGREE": 4}
    ahead = report.compile_ahead
    assert ahead is not None and ahead.never_judged == {}
    assert sum(ahead.judged_later.values()) >= 1


def test_cases_a_path_never_judged_for_want_of_its_module_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that outlasts the campaign: the other path's verdicts stand, and the report
    says how many cases the slow path did not judge, and why."""
    import io

    from difftest.interfaces.console import print_report

    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = _deferring_config(tmp_path, 3)
    try:
        with cpu_session(
            ("torch-sdpa", "blocking-build"), plugins=(PLUGIN,), budget_s=6.0
        ) as session:
            report = run_campaign(config, session)
    finally:
        (folder / "release-all").write_text("")
    n = report.cases  # 3 unless a loaded machine spent the budget first
    assert 1 <= n <= 3
    assert report.paths["torch-sdpa"].outcomes == {"AGREE": n}
    assert "blocking-build" not in report.paths or report.paths["blocking-build"].run == 0
    assert _ran(folder) == []
    ahead = report.compile_ahead
    assert ahead is not None and ahead.never_judged == {"blocking-build": n}
    assert ahead.judged_later == {}
    text = io.StringIO()
    print_report(report, text)
    assert (
        f"blocking-build: did not judge {n} case(s) the other paths ran (its module was still "
        "building when the campaign ended)" in text.getvalue()
    )


class _HeldAhead:
    """Stands in for :class:`CompileAhead` with builds that never finish: it records the
    deadline of every wait it is asked for."""

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        self.held = keys
        self.waited_until: list[float | None] = []

    def submit(self, cases: object) -> int:
        return 0

    def keys(self, cases: object) -> list[tuple[str, str]]:
        return list(self.held)

    def still_building(self, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [k for k in keys if k in self.held]

    def wait_for(
        self, cases: object, *, until: float | None = None, stop: object = None, first: bool = False
    ) -> float:
        self.waited_until.append(until)
        return 0.0


def test_a_build_is_waited_for_once_not_by_every_launch_that_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The patience runs from when a launch first needs a build: a later launch needing the
    same build does not wait for it again, and a new build gets its own patience. On a fake
    clock, so nothing here depends on how fast anything runs."""
    from difftest.campaign import ahead as campaign_ahead
    from difftest.campaign.keeping import Keeper
    from difftest.campaign.report import Tally
    from difftest.records.run_dir import RunDirectory
    from difftest.triage.groups import Triage

    clock = [100.0]
    monkeypatch.setattr(campaign_ahead.time, "monotonic", lambda: clock[0])
    config = dataclasses.replace(_deferring_config(tmp_path, 4), patience_s=10.0)
    [case] = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 1)]
    ahead = _HeldAhead([("blocking-build", "module-a")])
    with cpu_session(("torch-sdpa", "blocking-build"), plugins=(PLUGIN,)) as session:
        out, triage = RunDirectory(tmp_path / "out"), Triage()
        tally = Tally(config=config, jit=False)
        builds = campaign_ahead.BuildWaits(
            config=config,
            session=session,
            out=out,
            triage=triage,
            tally=tally,
            keeper=Keeper(config=config, session=session, out=out, triage=triage, tally=tally),
            ahead=ahead,  # type: ignore[arg-type]
        )
        held = [("blocking-build", "module-a")]
        assert builds.compile_ahead([case]) == held  # first needed at t = 100
        clock[0] = 105.0
        assert builds.compile_ahead([case]) == held
        clock[0] = 111.0
        builds.compile_ahead([case])
        ahead.held.append(("blocking-build", "module-b"))  # a build first needed at t = 111
        builds.compile_ahead([case])
    assert ahead.waited_until == [110.0, 110.0, 110.0, 121.0]


def _ahead_of(session, ledger: Path) -> CompileAhead:  # type: ignore[no-untyped-def]
    from difftest.execution.built_modules import BuiltModules

    return CompileAhead(
        session.runnable,
        session.device,
        1,
        plugins=(PLUGIN,),
        built=BuiltModules(ledger),
    )


def test_a_module_the_cache_holds_is_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that succeeds is recorded in the ledger; a later campaign's compile-ahead finds
    it there and neither starts a process nor waits for it."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    (folder / "release-all").write_text("")
    ledger = tmp_path / "cache" / "difftest-built-modules.json"
    config = CampaignConfig(seed=3, max_cases=2, cases_per_variant=2)
    cases = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 1)]
    vid = _variant_id(cases[0])
    with cpu_session(("blocking-build",), plugins=(PLUGIN,)) as session:
        with _ahead_of(session, ledger) as first:
            assert first.submit(cases) == 1
            first.wait_for(cases, until=time.monotonic() + SAFETY_S)
            assert first.unfinished(cases) == [] and first.results[0].error == ""
            assert first.cached == 0
        assert (folder / f"{vid}.started").exists()  # it was built
        key = first.keys(cases)[0]
        assert json.loads(ledger.read_text()) == [repr(key)]
        (folder / f"{vid}.started").unlink()
        with _ahead_of(session, ledger) as second:
            assert second.submit(cases) == 0  # nothing queued
            assert second.cached == 1 and second.pending() == 0
            assert second.unfinished(cases) == [] and second.building(cases) == set()
            assert second.wait_for(cases, until=time.monotonic() + SAFETY_S) < 1.0
            assert second.results == []  # no build was run
        assert not (folder / f"{vid}.started").exists()  # no build process ran the path


def test_a_failed_build_is_not_recorded_and_a_bad_ledger_counts_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from difftest.execution.built_modules import BuiltModules

    _fake_build_folder(tmp_path, monkeypatch)
    ledger = tmp_path / "difftest-built-modules.json"
    ledger.write_text("{not json")
    assert ("crashing-build", ("anything",)) not in BuiltModules(ledger)
    config = CampaignConfig(seed=5, max_cases=1)
    cases = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 1)]
    with cpu_session(("crashing-build",), plugins=(PLUGIN,)) as session:
        with _ahead_of(session, ledger) as ahead:
            assert ahead.submit(cases) == 1
            ahead.wait_for(cases, until=time.monotonic() + SAFETY_S)
            assert "SIGKILL" in ahead.results[0].error
    assert ledger.read_text() == "{not json"  # nothing recorded, nothing rewritten
    again = BuiltModules(ledger)
    again.add([("p", ("k", 1))])
    assert ("p", ("k", 1)) in BuiltModules(ledger)  # rewritten whole


def _looked_ahead(**config: object) -> int:
    """Templates compile-ahead is shown past the first, once the first case is drawn."""
    planner = Planner(CampaignConfig(seed=3, **config), torch.device("cpu"))  # type: ignore[arg-type]
    next(iter(planner))
    return len(planner.upcoming(8))


def test_the_look_ahead_stops_at_the_templates_a_case_limit_can_need() -> None:
    """A run of 200 cases, 200 per variant in launches of 8, needs one template: nothing past
    it is built (on the H200 the builds of variants it never reached cost 4-6 s of a 200-case
    run); a budget alone looks ahead in full, and a limit of 1,000 cases at 32 a variant in
    launches of 8 (256 a template at most) needs at most four templates: three past the first."""
    assert _looked_ahead(max_cases=200, cases_per_variant=200, pack=8) == 0
    assert _looked_ahead(cases_per_variant=200, pack=8) == 8
    assert _looked_ahead(max_cases=1000, cases_per_variant=32, pack=8) == 3
