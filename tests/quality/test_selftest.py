"""The self-test end to end: campaigns of the default generators find planted bugs, triage
puts each in one group with its trigger, the shrinker takes it to its minimal case, pairs of
bugs come out as two groups, and the report says so (or says what failed)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from difftest.calibration import selftest
from difftest.calibration.mutants import Mutant, get_mutant, get_pair
from difftest.calibration.mutants.mutant import Tiny
from difftest.campaign.planning import CPU_HYPOTHESIS_EVERY
from difftest.interfaces.cli import main
from difftest.model.errors import ExitCode
from difftest.model.outcome import Outcome
from difftest.paths.registry import register, unregister
from difftest.paths.torch_online import run as correct_run

FAST = ("mutant-causal-off-by-one", "mutant-padded-rows-as-requests", "mutant-gqa-modulo")
"""Mutants whose campaign and shrink take about a second on a CPU."""
BUDGET = selftest.Budget(max_cases=40, shrink_runs=250)


def test_selftest_command_detects_groups_and_shrinks_fast_mutants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "selftest.json"
    code = main(["selftest", "--mutants", ",".join(FAST), "--json", str(out), "--seed", "0"])
    printed = capsys.readouterr().out
    assert code == ExitCode.OK, printed
    report = json.loads(out.read_text())
    assert report["format"] == "difftest-selftest/2" and report["ok"] is True
    assert report["budget"] == {
        "max_cases": selftest.MAX_CASES,
        "shrink_runs": 250,
        "cases_per_variant": 1,
        "hypothesis_every": CPU_HYPOTHESIS_EVERY,
        "pack": 1,
    }
    assert [m["name"] for m in report["mutants"]] == list(FAST)
    triggers = {}
    for entry in report["mutants"]:
        mutant = get_mutant(entry["name"])
        assert entry["detected"] is True and entry["groups"] == 1
        assert Outcome(entry["outcome"]) in mutant.detected_as
        assert entry["cases_to_detect"] >= 1
        assert entry["minimal"] == mutant.minimal.size() == entry["shrunk"]
        assert entry["bug_class"] == mutant.bug_class
        assert entry["name"] in printed
        triggers[entry["name"]] = tuple(entry["trigger"])
    # each bug's trigger names what it needs
    assert triggers["mutant-causal-off-by-one"] == ("L>1",)
    assert triggers["mutant-padded-rows-as-requests"] == ("padding_rows",)
    assert triggers["mutant-gqa-modulo"] == ("group>1", "kv_heads>1")
    summary = report["summary"]
    assert summary["detection_rate"] == 1.0
    assert summary["shrunk_to_minimal"] == summary["one_group"] == len(FAST)
    assert "detected 3/3" in printed


@pytest.fixture
def registered() -> Iterator[list[Mutant]]:
    """Mutants a test makes up, registered for the test only."""
    made: list[Mutant] = []
    yield made
    for mutant in made:
        unregister(mutant.name)


def _as_mutant(made: list[Mutant], name: str, **changes: Any) -> Mutant:
    mutant = dataclasses.replace(get_mutant("mutant-causal-off-by-one"), name=name, **changes)
    register(mutant.path(), replace=True)
    made.append(mutant)
    return mutant


def test_a_correct_kernel_is_reported_missed(registered: list[Mutant]) -> None:
    correct = _as_mutant(registered, "mutant-without-a-bug", run=correct_run)
    report = selftest.run_selftest([correct], [], budget=BUDGET)
    (result,) = report.results
    assert result.detected is False and result.ok is False
    assert result.cases_to_detect is None and result.shrunk is None
    assert result.cases_run == BUDGET.max_cases and result.groups == 0
    assert report.ok is False
    assert report.summary()["detection_rate"] == 0.0


def test_findings_of_another_kind_are_not_taken_as_detection(
    tmp_path: Path, registered: list[Mutant]
) -> None:
    # A wrong-output bug declared as a race: its WRONG group must not count.
    mislabelled = _as_mutant(
        registered, "mutant-mislabelled", detected_as=frozenset({Outcome.NONDETERMINISTIC})
    )
    (result,) = selftest.run_selftest([mislabelled], [], budget=BUDGET, out_dir=tmp_path).results
    assert result.detected is False and result.ok is False
    assert result.groups >= 1  # the WRONG bug is there, as a group of its own
    logged = (tmp_path / "mutant-mislabelled" / "findings.jsonl").read_text().splitlines()
    assert logged and all(json.loads(line)["result"]["outcome"] == "WRONG" for line in logged)


def test_a_shrink_above_the_minimal_size_fails_the_mutant(registered: list[Mutant]) -> None:
    # The bug needs L >= 2; declaring a one-token case minimal cannot be met.
    overclaimed = _as_mutant(registered, "mutant-overclaimed", minimal=Tiny().case())
    (result,) = selftest.run_selftest([overclaimed], [], budget=BUDGET).results
    assert result.detected is True and result.groups == 1
    assert result.shrunk is not None and result.shrunk > result.minimal
    assert result.shrunk_to_minimal is False and result.ok is False


def test_a_pair_of_bugs_comes_out_as_two_groups_and_the_known_one_hides_nothing() -> None:
    pair = get_pair("mutant-pair-sinks-ignored+partial-last-page")
    report = selftest.run_selftest([], [pair], budget=BUDGET)
    (result,) = report.pairs
    assert result.ok, result.to_json()
    assert result.groups == 2
    first, second = result.parts
    assert first.trigger == ("sinks",) and second.trigger == ("page_size>1",)
    assert first.shrunk == first.minimal and second.shrunk == second.minimal
    assert result.with_known is not None and result.with_known.found
    assert result.with_known.trigger == ("page_size>1",) and result.within_twice
    assert report.ok


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["selftest", "--max-cases", "0"]) == ExitCode.USAGE
    assert main(["selftest", "--mutants", "mutant-nope"]) == ExitCode.USAGE
    assert "unknown mutant 'mutant-nope'" in capsys.readouterr().err
