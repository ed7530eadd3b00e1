"""A campaign over a path that aborts and one that never returns, beside two healthy paths,
stays within its budget, quarantines the broken paths, and lets the healthy ones run as many
cases as they run without the broken ones (issue 14)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _planted import one_torch_thread  # noqa: F401

from difftest.campaign.loop import MAX_UNJUDGED
from difftest.interfaces.cli import main
from difftest.records.repro import load_repro

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
HEALTHY = "good-sdpa,torch-paged-online"
BROKEN = "bad-abort,bad-hang"
BUDGET_S = 120.0
"""Generous: the healthy paths must reach CASES well inside it even on a loaded machine (the
assertions are on what the budget bounds and on counts, never on speed)."""
CASES = 30
WORKERS = 2
"""Launches at once (a CPU run's default on two cores): a path is quarantined for the
launches started after its second loss is accounted; those already started run it still."""


def _run(
    tmp_path: Path, name: str, paths: str, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, object], float, int]:
    report = tmp_path / f"{name}.json"
    start = time.monotonic()
    code = main(
        [
            "run",
            "--plugin",
            PLUGIN,
            "--paths",
            paths,
            "--budget-s",
            str(BUDGET_S),
            "--max-cases",
            str(CASES),
            "--out",
            str(tmp_path / name),
            "--json",
            str(report),
            "--no-known",
            "--workers",
            str(WORKERS),
        ]
    )
    wall = time.monotonic() - start
    err = capsys.readouterr().err
    assert report.exists(), err
    return json.loads(report.read_text()), wall, code


@pytest.mark.slow
def test_broken_paths_are_quarantined_within_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alone, _, code = _run(tmp_path, "healthy", HEALTHY, capsys)
    assert code == 0
    with_broken, wall, code = _run(tmp_path, "broken", f"{HEALTHY},{BROKEN}", capsys)
    assert code == 1  # the CRASH and HANG groups are new findings

    # The budget bounds everything the command did, shrinking included.
    assert wall <= BUDGET_S * 1.1, wall
    paths = with_broken["paths"]
    assert isinstance(paths, dict) and isinstance(alone["paths"], dict)
    for healthy in HEALTHY.split(","):
        ran_alone = alone["paths"][healthy]["run"]
        assert ran_alone == CASES
        assert paths[healthy]["run"] >= 0.8 * ran_alone, paths[healthy]
        assert paths[healthy]["outcomes"] == {"AGREE": paths[healthy]["run"]}
    for broken in BROKEN.split(","):
        assert paths[broken]["quarantined"], paths[broken]
        # quarantined after two losses, plus the launches in flight when the second one was
        # accounted: at most MAX_UNJUDGED per worker, that one included
        assert paths[broken]["run"] <= 2 + MAX_UNJUDGED * WORKERS - 1, paths[broken]
    kinds = {(g["path"], g["kind"]) for g in with_broken["groups"]}
    assert kinds == {("bad-abort", "CRASH"), ("bad-hang", "HANG")}
    health = {h["check"] for h in with_broken["health"]}
    assert "quarantined" in health
    for group in with_broken["groups"]:
        repro = load_repro(group["minimal"])
        assert repro.finding is not None and repro.finding.path == group["path"]
