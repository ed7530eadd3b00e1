"""Packed-only findings (wrong in a packed launch, right alone) in groups, and what a run, the
gate's reports and the pytest plugin's failure say of them: they are unexpected, never a
silent line in the findings list."""

from __future__ import annotations

import dataclasses
import json
import runpy
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from _planted import cpu_session, one_torch_thread  # noqa: F401  (autouse: one torch thread)

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig
from difftest.campaign.report import CampaignReport
from difftest.campaign.sharding import Shard
from difftest.campaign.suite import PresetRun, ShardPlan, ShardResult
from difftest.generation.strategies import Limits
from difftest.interfaces.cli import main
from difftest.interfaces.gate.report import CorpusSummary, GateRun, junit_xml, markdown, to_json
from difftest.model.errors import ExitCode
from difftest.model.outcome import Outcome
from difftest.paths import all_paths, unregister
from difftest.triage.packed_only import PackedOnlyFinding, packed_only_groups

SLOTS_PLUGIN = str(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "launch_slots.py")


def _finding(
    index: int, path: str = "p", variant: str = "v1", digest: str = "", requests: int = 2
) -> PackedOnlyFinding:
    return PackedOnlyFinding(
        path=path,
        kind=Outcome.WRONG,
        detail="tolerance",
        variant=variant,
        index=index,
        case_digest=digest or f"d{index}",
        repro=f"packed/{index}.json",
        requests=requests,
        launch_requests=10 * index,
    )


def test_findings_are_grouped_by_path_and_variant_largest_first() -> None:
    findings = [
        _finding(40, variant="v2"),
        _finding(9, requests=5),
        _finding(30, variant="v2"),
        _finding(12, path="q"),
        _finding(50, variant="v2"),
        _finding(3),
        _finding(7, digest="d3"),  # the same case again, in another launch
    ]
    groups = packed_only_groups(findings)
    assert [(g.path, g.variant, g.count) for g in groups] == [
        ("p", "v1", 3),  # 3 findings, met first at case 3: before v2's 3 (first at 30)
        ("p", "v2", 3),
        ("q", "v1", 1),
    ]
    first = groups[0]
    assert first.first_index == 3 and first.repro == "packed/3.json"
    assert first.digests == ("d3", "d9")  # each case once, in the order met
    assert groups[1].first_index == 30 and groups[1].repro == "packed/30.json"
    assert first.id == "packed-only p WRONG v1" != groups[2].id
    assert first.to_json() == {
        "id": "packed-only p WRONG v1",
        "path": "p",
        "kind": "WRONG",
        "detail": "tolerance",
        "variant": "v1",
        "count": 3,
        "first_index": 3,
        "digests": ["d3", "d9"],
        "repro": "packed/3.json",
        "requests": [2, 5],
        "launch_requests": [30, 90],  # launches of cases 3, 7 and 9: 10 requests an index
    }
    assert first.lines()[2] == "    requests: 2-5 a case alone, 30-90 in the launches it failed in"
    assert groups[2].lines()[2] == "    requests: 2 a case alone, 120 in the launches it failed in"
    assert "3 finding(s) (first at case 3)" in first.lines()[0]
    assert packed_only_groups([]) == []


@pytest.fixture(name="slots_report")
def slots_report_fixture(tmp_path: Path) -> Iterator[CampaignReport]:
    """A packed CPU campaign over ``launch-slots-8`` (right on its cases alone, wrong past the
    eighth request of a launch): its findings are all packed-only."""
    before = {p.name for p in all_paths()}
    runpy.run_path(SLOTS_PLUGIN)
    try:
        small = Limits(max_requests=6, max_prefix=320, long_share=0)
        config = CampaignConfig(seed=2, pack=4, max_cases=40, out_dir=tmp_path, limits=small)
        with cpu_session(("launch-slots-8", "torch-sdpa")) as session:
            report = run_campaign(config, session)
        assert report.findings and all(f.packed_only for f in report.findings)
        yield report
    finally:
        for path in all_paths():
            if path.name not in before:
                unregister(path.name)


def _gate_run(report: CampaignReport, tmp_path: Path) -> GateRun:
    plan = ShardPlan(seed=2, out_dir=tmp_path, max_cases=40)
    result = ShardResult(
        plan=plan, runs=(PresetRun(preset=None, report=report, cases=(), planned=None),)
    )
    return GateRun(
        profile="dev",
        derandomized=True,
        shard=Shard(),
        device="cpu",
        environment=report.environment,
        paths=("launch-slots-8", "torch-sdpa"),
        unavailable={},
        result=result,
        corpus=CorpusSummary(status="disabled", reason="--no-corpus"),
        out_dir=tmp_path,
    )


def test_the_gate_fails_on_packed_only_groups_and_says_where_they_are(
    slots_report: CampaignReport, tmp_path: Path
) -> None:
    run = _gate_run(slots_report, tmp_path)
    packed = slots_report.packed_only_groups
    assert not run.unexpected() and [g for _, g in run.packed_only()] == packed
    assert run.exit_code is ExitCode.FINDINGS
    assert run.verdict == (
        f"FAIL: 0 unexpected group(s), {len(packed)} packed-only group(s), 0 corpus failure(s)"
    )

    suite = ET.fromstring(junit_xml(run)).find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    failed = {
        c.get("name"): c.find("failure")
        for c in suite.iter("testcase")
        if c.find("failure") is not None
    }
    assert list(failed) == ["launch-slots-8 [any] shard 0/1"]
    failure = failed["launch-slots-8 [any] shard 0/1"]
    assert failure is not None and failure.get("type") == "WRONG"
    assert f"{len(packed)} packed-only group(s)" in (failure.get("message") or "")
    assert str(packed[0].repro) in (failure.text or "")

    text = markdown(run)
    assert text.startswith("### difftest gate: FAIL: 0 unexpected group(s), ")
    n = sum(g.count for g in packed)
    assert f"**Packed-only** ({len(packed)} group(s), {n} finding(s)" in text
    assert f"- `launch-slots-8` WRONG [any]: {packed[0].count} finding(s) on " in text

    data = json.loads(json.dumps(to_json(run)))
    assert [g["id"] for g in data["packed_only"]] == [g.id for g in packed]
    assert data["exit_code"] == 1
    assert run.result.failure_lines()[0].startswith("PACKED-ONLY: launch-slots-8 WRONG")


def test_a_report_without_packed_only_findings_passes_as_before(
    slots_report: CampaignReport, tmp_path: Path
) -> None:
    clean = dataclasses.replace(slots_report, findings=())
    assert clean.packed_only_groups == [] and clean.exit_code() is ExitCode.OK
    run = _gate_run(clean, tmp_path)
    assert run.exit_code is ExitCode.OK and run.verdict == "PASS"
    assert "Packed-only" not in markdown(run)


def test_triage_of_the_run_folder_groups_them_the_same_way(
    slots_report: CampaignReport, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "triage.json"
    code = main(["triage", str(tmp_path), "--no-known", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == ExitCode.FINDINGS
    data = json.loads(out.read_text())
    assert data["packed_only"] == len(slots_report.findings)
    assert data["packed_only_groups"] == [g.to_json() for g in slots_report.packed_only_groups]
    assert all(Path(g["repro"]).is_file() for g in data["packed_only_groups"])
    assert f"{len(slots_report.findings)} finding(s) shown only by packed launches" in text
    assert "PACKED-ONLY: launch-slots-8 WRONG (tolerance)" in text
