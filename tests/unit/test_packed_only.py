"""Packed-only findings (wrong in a packed launch, right alone) in groups, and what a run, the
gate's reports and the pytest plugin's failure say of them: they are unexpected, never a
silent line in the findings list."""

from __future__ import annotations

import dataclasses
import io
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
from difftest.interfaces.console import print_report
from difftest.interfaces.gate.report import CorpusSummary, GateRun, junit_xml, markdown, to_json
from difftest.model.errors import ExitCode
from difftest.model.outcome import Outcome
from difftest.paths import all_paths, unregister
from difftest.records.corpus import DEFAULT_CORPUS, known_bugs
from difftest.records.repro import load_repro
from difftest.triage.features import matches
from difftest.triage.groups import KnownBug
from difftest.triage.packed_only import (
    PackedOnlyFinding,
    in_launch,
    likely_known,
    packed_only_groups,
)

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
        "likely_known": {},
    }
    assert first.lines()[2] == "    requests: 2-5 a case alone, 30-90 in the launches it failed in"
    assert groups[2].lines()[2] == "    requests: 2 a case alone, 120 in the launches it failed in"
    assert "3 finding(s) (first at case 3)" in first.lines()[0]
    assert packed_only_groups([]) == []


def test_a_group_names_the_known_bugs_its_findings_likely_are_with_counts() -> None:
    named = [
        dataclasses.replace(_finding(1), likely_known=("a",)),
        dataclasses.replace(_finding(2), likely_known=("b", "a")),
        _finding(3),
        dataclasses.replace(_finding(4), likely_known=("a",)),
    ]
    [group] = packed_only_groups(named)
    assert group.likely_known == (("a", 3), ("b", 1))
    assert group.to_json()["likely_known"] == {"a": 3, "b": 1}
    assert group.lines()[4:] == [
        "    likely known: a for 3 of 4 (the case placed in its launch has its trigger, alone "
        "it has not; not rechecked)",
        "    likely known: b for 1 of 4 (the case placed in its launch has its trigger, alone "
        "it has not; not rechecked)",
    ]


SGLANG_MASK = DEFAULT_CORPUS / "xqa-sglang-draft-length-mask.repro.json"


def test_a_one_request_case_of_the_sglang_mask_bug_is_named_in_a_launch_only() -> None:
    """The SGLang draft-mask entry needs a second request (request ``b > 0`` reads request 0's
    mask rows): its case cut to one request agrees alone, and in a launch with another case
    it is request 1. Placed in that launch it has the trigger, so the entry is named; a case
    that alone already has the trigger is not named (the trigger does not say then why the
    launch failed it), nor is an entry of another path, outcome or detail."""
    repro = load_repro(SGLANG_MASK)
    known = known_bugs(DEFAULT_CORPUS)
    [bug] = [b for b in known if b.name == "xqa-sglang-draft-length-mask"]
    result = repro.path_result()
    assert result is not None
    one = repro.case.replace(batch=dataclasses.replace(repro.case.batch, prefix_lens=(0,)))
    other = dataclasses.replace(one, seed=one.seed + 1)
    assert matches(repro.case, bug.trigger) and not matches(one, bug.trigger)
    placed = in_launch(other, [one, other])
    assert placed is not None and placed.batch.num_requests == 2
    assert placed.convention == other.convention and placed.values == other.values
    assert likely_known(other, result, [one, other], known) == (bug.name,)
    assert likely_known(repro.case, result, [repro.case, other], known) == ()
    elsewhere = dataclasses.replace(bug, name="other-path", path="fi-decode-wrapper")
    crashed = dataclasses.replace(result, outcome=Outcome.CRASH)
    assert likely_known(other, result, [one, other], [elsewhere]) == ()
    assert likely_known(other, crashed, [one, other], known) == ()
    assert in_launch(one, []) is None and in_launch(one, [one]) is None  # no launch to place in


SLOTS_BUG = KnownBug(
    name="slots-past-eight",
    path="launch-slots-8",
    kind=Outcome.WRONG,
    detail="tolerance",
    trigger=("requests>8",),
)
"""A known bug of the slots fixture as a corpus would declare it: wrong past the eighth
request, which only a launch reaches at the CPU limits."""


@pytest.fixture(name="slots_report")
def slots_report_fixture(tmp_path: Path) -> Iterator[CampaignReport]:
    """A packed CPU campaign over ``launch-slots-8`` (right on its cases alone, wrong past the
    eighth request of a launch): its findings are all packed-only. Its known bug is given
    (:data:`SLOTS_BUG`), as a corpus would give it."""
    before = {p.name for p in all_paths()}
    runpy.run_path(SLOTS_PLUGIN)
    try:
        small = Limits(max_requests=6, max_prefix=320, long_share=0)
        config = CampaignConfig(
            seed=2, pack=4, max_cases=40, out_dir=tmp_path, limits=small, known=(SLOTS_BUG,)
        )
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
    n0 = packed[0].count
    assert f"; likely known `slots-past-eight` ({n0} of {n0}, not rechecked)" in text

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
    # the same groups; their likely known bugs are named against the corpus triage is given
    # (--no-known: none), not the campaign's
    assert data["packed_only_groups"] == [
        {**g.to_json(), "likely_known": {}} for g in slots_report.packed_only_groups
    ]
    assert all(Path(g["repro"]).is_file() for g in data["packed_only_groups"])
    assert f"{len(slots_report.findings)} finding(s) shown only by packed launches" in text
    assert "PACKED-ONLY: launch-slots-8 WRONG (tolerance)" in text


def test_a_campaigns_packed_only_groups_name_the_known_bug_and_still_fail(
    slots_report: CampaignReport,
) -> None:
    """Every finding of the slots campaign is the given known bug placed in its launch: each
    group names it for all its findings, in the summary and the JSON, and the run still
    exits 1 (a name is a lead, not a recheck)."""
    groups = slots_report.packed_only_groups
    assert groups and all(g.likely_known == (("slots-past-eight", g.count),) for g in groups)
    assert all(f.likely_known == ("slots-past-eight",) for f in slots_report.findings)
    printed = io.StringIO()
    print_report(slots_report, printed)
    n = groups[0].count
    assert f"    likely known: slots-past-eight for {n} of {n} (" in printed.getvalue()
    data = json.loads(json.dumps(slots_report.to_json()))
    assert data["packed_only_groups"][0]["likely_known"] == {"slots-past-eight": groups[0].count}
    assert slots_report.exit_code() is ExitCode.FINDINGS


def test_triage_names_the_known_bugs_of_the_corpus_it_is_given(
    slots_report: CampaignReport, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``difftest triage`` names a packed-only group's likely known bugs against the corpus it
    reads now: a corpus whose one entry declares the slots bug names it for every finding
    (and the groups still fail the triage)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    entry = {
        "format": "difftest-corpus/2",
        "repro": "slots.repro.json",
        "description": "launch-slots-8 is wrong past the eighth request of a launch",
        "expect": {"flashinfer": {"0.7.4": "still_fails"}},
        "known": {
            "path": SLOTS_BUG.path,
            "kind": "WRONG",
            "detail": "tolerance",
            "trigger": list(SLOTS_BUG.trigger),
        },
    }
    (corpus / "slots.json").write_text(json.dumps(entry))
    out = tmp_path / "triage.json"
    code = main(["triage", str(tmp_path), "--corpus", str(corpus), "--json", str(out)])
    assert code == ExitCode.FINDINGS, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert [g["likely_known"] for g in data["packed_only_groups"]] == [
        {"slots": g.count} for g in slots_report.packed_only_groups
    ]
