"""The self-test end to end: campaigns of the default generators find planted bugs, the shrinker
takes them to their minimal cases, and the report says so (or says what failed, loudly)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from difftest.calibration import selftest
from difftest.calibration.mutants import Mutant, get_mutant
from difftest.interfaces.cli import build_parser, main
from difftest.model.errors import ExitCode
from difftest.model.outcome import CaseResult, Outcome
from difftest.paths.torch_online import run as correct_run
from difftest.records.schemas import load_schema, validate
from difftest.reduction.driver import ShrinkOutcome
from difftest.reduction.report import ShrinkReport

FAST = ("mutant-causal-off-by-one", "mutant-padded-rows-as-requests", "mutant-gqa-modulo")
"""Mutants whose campaign and shrink take about a second on a CPU."""


def test_selftest_command_detects_and_shrinks_fast_mutants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "selftest.json"
    code = main(["selftest", "--mutants", ",".join(FAST), "--json", str(out), "--seed", "0"])
    printed = capsys.readouterr().out
    assert code == ExitCode.OK, printed
    report = json.loads(out.read_text())
    assert validate(report, selftest.SCHEMA) == []
    assert report["ok"] is True
    assert [m["name"] for m in report["mutants"]] == list(FAST)
    for entry in report["mutants"]:
        mutant = get_mutant(entry["name"])
        assert entry["detected"] is True
        assert Outcome(entry["outcome"]) in mutant.detected_as
        assert entry["cases_to_detect"] >= 1
        assert entry["minimal"] == mutant.minimal.size()
        assert entry["shrunk"] == entry["minimal"] < entry["original"]
        assert entry["bug_class"] == mutant.bug_class
        assert entry["error"] is None
        assert entry["name"] in printed
    summary = report["summary"]
    assert summary["detection_rate"] == 1.0
    assert summary["shrunk_to_minimal"] == len(FAST)
    assert summary["median_shrink_ratio"] == 1.0
    assert "detected 3/3" in printed


def _as_mutant(name: str, **changes: Any) -> Mutant:
    return dataclasses.replace(get_mutant("mutant-causal-off-by-one"), name=name, **changes)


def test_a_correct_kernel_is_reported_missed() -> None:
    correct = _as_mutant("mutant-without-a-bug", run=correct_run)
    report = selftest.run_selftest(
        [correct], budget_s=60.0, max_cases=20, shrink=_no_shrink_expected
    )
    (result,) = report.results
    assert result.detected is False and result.ok is False
    assert result.cases_to_detect is None and result.shrunk is None
    assert result.cases_run == 20
    assert report.ok is False
    assert report.summary()["detection_rate"] == 0.0


def _no_shrink_expected(*args: object, **kwargs: object) -> ShrinkOutcome:
    raise AssertionError("a correct kernel has nothing to shrink")


def test_findings_of_another_kind_are_counted_not_taken_as_detection(tmp_path: Path) -> None:
    # A wrong-output bug declared as a race: its WRONG findings must not count.
    mislabelled = _as_mutant(
        "mutant-mislabelled", detected_as=frozenset({Outcome.NONDETERMINISTIC})
    )
    (result,) = selftest.run_selftest(
        [mislabelled], budget_s=60.0, max_cases=10, out_dir=tmp_path, shrink=_no_shrink_expected
    ).results
    assert result.detected is False
    assert result.other_findings.get("WRONG", 0) >= 1
    assert set(result.other_findings) == {"WRONG"}
    repros = sorted((tmp_path / "mutant-mislabelled" / "findings").glob("*.json"))
    assert len(repros) == result.other_findings["WRONG"]
    for file in repros:  # kept unshrunk, in a valid repro file
        data = json.loads(file.read_text())
        assert validate(data, load_schema("repro")) == []
        assert data["shrink"]["runs"] == 0
        assert data["shrink"]["message"].startswith("not shrunk")


def test_a_shrink_above_the_minimal_size_fails_the_mutant() -> None:
    def keep(case, finding, executor, *, budget):  # type: ignore[no-untyped-def]
        result = CaseResult(case_digest=case.digest(), results=(finding,))
        report = ShrinkReport(
            reproduced=True,
            original_size=case.size(),
            shrunk_size=case.size(),
            original_digest=case.digest(),
            shrunk_digest=case.digest(),
            runs=0,
            seconds=0.0,
        )
        return ShrinkOutcome(case=case, result=result, report=report)

    mutant = get_mutant("mutant-causal-off-by-one")
    (result,) = selftest.run_selftest([mutant], budget_s=30.0, shrink=keep).results
    assert result.detected is True
    assert result.shrunk is not None
    assert result.shrunk == result.original and result.shrunk > result.minimal
    assert result.shrunk_to_minimal is False and result.ok is False
    assert result.shrink_runs == 0


def test_a_missing_shrinker_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The CLI imports every command module (``run`` imports the shrinker) when it builds its
    # parser: build it first, so this test does not depend on what ran before it in the process.
    build_parser()
    monkeypatch.setitem(sys.modules, "difftest.reduction", None)
    code = main(["selftest", "--mutants", "mutant-gqa-modulo", "--budget-s", "5"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "mutant-gqa-modulo: ERROR, not measured: needs difftest.reduction.shrink" in err


def test_a_missing_isolated_executor_is_never_a_detection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "difftest.execution.isolation", None)
    (result,) = selftest.run_selftest([get_mutant("mutant-hang-large-group")]).results
    assert result.detected is False and result.ok is False
    assert (
        result.error is not None and "difftest.execution.isolation.IsolatedExecutor" in result.error
    )
    assert result.cases_run == 0


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest", "--budget-s", "0"]) == ExitCode.USAGE
    assert main(["selftest", "--mutants", "mutant-nope"]) == ExitCode.USAGE
    assert "unknown mutant 'mutant-nope'" in capsys.readouterr().err


def test_every_mutant_gets_the_same_planned_cases() -> None:
    stream = selftest.CaseStream(seed=3, device_type="cpu")
    first = [(i, c.digest()) for _, (i, c) in zip(range(70), stream, strict=False)]
    again = [(i, c.digest()) for _, (i, c) in zip(range(70), stream, strict=False)]
    assert first == again
    assert [i for i, _ in first] == list(range(70))
