"""Issue 5's done-when on CPU: a campaign over a path that aborts, one that segfaults, one that
never returns and a good one finishes within its budget plus a deadline, reports CRASH and HANG
findings with repros, and keeps the good path's results intact."""

from __future__ import annotations

import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest

from difftest.campaign.run import CampaignConfig, run_campaign
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.model.outcome import Outcome
from difftest.paths import all_paths, resolve, unregister
from difftest.records.repro import load_repro

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
PATHS = ["good-sdpa", "bad-abort", "bad-segfault", "bad-hang"]
DEADLINE = Deadline(base_s=2.0, cold_s=0.0, per_gwork_s=0.0, per_melem_s=0.0, grace_s=0.5)
STARTUP_SLACK_S = 20.0
"""The last case may begin just before the budget runs out: its three worker start-ups (a
torch import each, 1.5 s on an idle 2-core machine, 4 s on a loaded one) and its reruns."""


@pytest.fixture
def bad_paths() -> Iterator[None]:
    """The fixture plugin's paths, registered in this process only during the test."""
    before = {p.name for p in all_paths()}
    runpy.run_path(PLUGIN)
    yield
    for path in all_paths():
        if path.name not in before:
            unregister(path.name)


@pytest.mark.slow
@pytest.mark.usefixtures("bad_paths")
def test_a_campaign_over_crashing_and_hanging_paths_keeps_going(tmp_path: Path) -> None:
    config = CampaignConfig(
        seed=3, budget_s=20.0, max_cases=6, out_dir=tmp_path / "out", plugins=(PLUGIN,)
    )
    with IsolatedExecutor(resolve(PATHS), "cpu", plugins=[PLUGIN], deadline=DEADLINE) as ex:
        report = run_campaign(config, ex)

    assert 2 <= report.cases <= 6
    assert report.wall_s <= config.budget_s + DEADLINE.base_s + STARTUP_SLACK_S
    stats = report.paths
    assert dict(stats["good-sdpa"].outcomes) == {"AGREE": report.cases}
    assert dict(stats["bad-abort"].outcomes) == {"CRASH": report.cases}
    assert dict(stats["bad-segfault"].outcomes) == {"CRASH": report.cases}
    assert dict(stats["bad-hang"].outcomes) == {"HANG": report.cases}

    kinds = sorted((f["path"], f["kind"]) for f in report.findings)
    assert kinds == sorted(
        [("bad-abort", "CRASH"), ("bad-segfault", "CRASH"), ("bad-hang", "HANG")] * report.cases
    )
    for finding in report.findings:
        repro = load_repro(finding["repro"])
        assert repro.finding is not None
        assert (repro.finding.path, repro.finding.kind.value) == (finding["path"], finding["kind"])
        assert repro.plugins == (PLUGIN,)
        assert repro.result is not None
        good = repro.result.result_for("good-sdpa")
        assert good is not None and good.outcome is Outcome.AGREE
    assert len(list((tmp_path / "out" / "findings").glob("*.json"))) == 3 * report.cases
    assert not list((tmp_path / "out" / "running").glob("*"))  # every case completed
