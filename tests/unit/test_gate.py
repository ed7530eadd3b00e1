"""The pre-merge gate: deterministic case lists, exact shard partitions, a planted bad path
failing with JUnit failures and repro links, corpus replay and setup errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import difftest
from difftest.campaign.sharding import Shard, all_shards, partition_defects
from difftest.interfaces.gate import command as gate

ROOT = Path(__file__).resolve().parents[2]
BAD_PATH = ROOT / "tests" / "fixtures" / "gate_bad_path.py"
PLANTED_FILE = ROOT / "tests" / "fixtures" / "planted.py"
CORPUS = ROOT / "tests" / "corpus"
PACKAGE_CORPUS = ROOT / "difftest" / "corpus"
FAST = ["--preset", "any", "--isolation", "none", "--no-shrink"]

Gate = Callable[..., tuple[int, str, dict[str, Any]]]


@pytest.fixture
def run_gate(tmp_path: Path) -> Iterator[Gate]:
    """``run_gate(*args) -> (exit code, text, JSON report)``, in this process."""
    modules = set(sys.modules)
    count = iter(range(1000))

    def run(*args: str) -> tuple[int, str, dict[str, Any]]:
        report = tmp_path / f"gate-{next(count)}.json"
        out = io.StringIO()
        code = gate.main([*args, "--json", str(report), "--out", str(tmp_path / "out")], out=out)
        data = json.loads(report.read_text()) if report.exists() else {}
        return code, out.getvalue(), data

    yield run
    # A plugin file registers its path once per import: forget both, so the next test that
    # loads it registers it again and no other test sees it.
    difftest.unregister("gate-bad-path")
    for name in set(sys.modules) - modules:
        if name.startswith("difftest_plugin_"):
            del sys.modules[name]


def test_ci_profile_gives_the_same_case_list_for_the_same_seed(run_gate: Gate) -> None:
    args = ["--profile", "ci", *FAST, "--max-cases", "6", "--paths", "torch-sdpa", "--no-corpus"]
    code1, _, first = run_gate(*args)
    code2, _, second = run_gate(*args)
    _, _, other_seed = run_gate(*args, "--seed", "1")
    assert code1 == code2 == 0
    assert first["derandomized"] is True and first["cases"] == 6
    assert first["case_digest"] == second["case_digest"]
    assert first["case_list"] == second["case_list"]
    assert other_seed["case_digest"] != first["case_digest"]


def test_shards_partition_the_unsharded_run(run_gate: Gate) -> None:
    args = ["--profile", "ci", *FAST, "--max-cases", "7", "--paths", "torch-sdpa", "--no-corpus"]
    _, _, whole = run_gate(*args)

    def keys(report: dict[str, Any]) -> list[tuple[str, int, str]]:
        return [(c["preset"], c["index"], c["digest"]) for c in report["case_list"]]

    parts = []
    for shard in all_shards(3):
        code, text, report = run_gate(*args, "--shard", str(shard))
        assert code == 0
        assert f"shard {shard}" in text
        assert report["cases"] == Shard(shard.index, 3).case_count(7)
        parts.append(keys(report))
    assert len(keys(whole)) == 7
    assert partition_defects(parts, keys(whole)) == []
    assert sorted(k for part in parts for k in part) == sorted(keys(whole))


def test_planted_bad_path_fails_naming_the_path_and_linking_repros(
    run_gate: Gate, tmp_path: Path
) -> None:
    junit, summary = tmp_path / "reports" / "gate.xml", tmp_path / "reports" / "summary.md"
    code, text, report = run_gate(
        "--profile", "ci", "--preset", "any", "--max-cases", "6", "--no-corpus",
        "--isolation", "none", "--paths", "torch-sdpa,gate-bad-path", "--plugin", str(BAD_PATH),
        "--junit", str(junit), "--summary", str(summary),
    )  # fmt: skip
    assert code == 1
    [group] = report["groups"]
    assert (group["path"], group["kind"], group["known"]) == ("gate-bad-path", "WRONG", None)
    assert report["unexpected"] == [group["id"]]
    repro = Path(group["minimal"])
    assert repro.is_file()
    # The group is shrunk: to two requests, the fewest this bug needs.
    shrunk = difftest.Case.from_json(json.loads(repro.read_text())["case"])
    assert shrunk.batch.num_requests == 2
    assert group["minimal_size"] == shrunk.size()
    assert "requests>1" in group["trigger"]

    cases = ET.parse(junit).getroot().iter("testcase")
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert list(failed) == ["gate-bad-path [any] shard 0/1"]
    failure = failed["gate-bad-path [any] shard 0/1"]
    assert failure is not None and failure.get("type") == "WRONG"
    assert f"repro {repro}" in (failure.get("message") or "")
    assert str(repro) in (failure.text or "")

    markdown = summary.read_text()
    assert markdown.startswith("### difftest gate: FAIL: 1 unexpected group(s), 0 corpus")
    assert "| `torch-sdpa` | any | 6 | 6 | 0 | 0 |" in markdown
    link = f"[`{repro.name}`]({os.path.relpath(repro, summary.parent)})"
    assert link in markdown and "NEW `gate-bad-path` WRONG" in markdown
    assert (summary.parent / os.path.relpath(repro, summary.parent)).is_file()
    assert text.endswith(f"repros under {tmp_path / 'out'}\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard", "3/3"], "--shard '3/3': the index must be in 0..2"),
        (["--profile", "weekly"], "--profile: unknown profile 'weekly'"),
        (["--preset", "llama-9"], "unknown preset 'llama-9'"),
        (["--paths", "no-such-path"], "unknown path 'no-such-path'"),
        (["--paths", "gate-never-here"], "path gate-never-here was asked for but cannot run"),
        (["--max-cases", "0"], "--max-cases 0 must be >= 1"),
        (["--plugin", "tests/fixtures/none.py"], "plugin file not found"),
    ],
)
def test_setup_errors_exit_2_with_one_line(
    run_gate: Gate, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    difftest.register_path(
        "gate-never-here", lambda b: b.q, available=lambda device: "never available"
    )
    try:
        code, _, report = run_gate(*FAST, "--max-cases", "2", *args)
    finally:
        difftest.unregister("gate-never-here")
    err = capsys.readouterr().err
    assert code == 2 and report == {}
    assert err.startswith("gate: error: ") and message in err
    assert err.count("\n") == 1


CORPUS_ARGS = [*FAST, "--profile", "ci", "--max-cases", "2", "--paths", "torch-sdpa"]


def test_missing_corpus_is_reported_and_fatal_only_when_required(
    run_gate: Gate, tmp_path: Path
) -> None:
    summary = tmp_path / "s.md"
    missing = tmp_path / "no-corpus"
    code, _, report = run_gate(*CORPUS_ARGS, "--corpus", str(missing), "--summary", str(summary))
    assert code == 0
    assert report["corpus"]["status"] == "unavailable"
    assert f"- corpus replay unavailable: no corpus directory {missing}" in summary.read_text()
    code, _, report = run_gate(*CORPUS_ARGS, "--corpus", str(missing), "--require-corpus")
    assert code == 2
    assert report["setup_error"] == (
        f"corpus replay required but unavailable: no corpus directory {missing}"
    )


def test_corpus_entries_with_unexpected_outcomes_fail_the_gate(
    run_gate: Gate, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("planted-fixed", "planted-window"):
        shutil.copy(CORPUS / f"{name}.repro.json", corpus)
        shutil.copy(CORPUS / f"{name}.json", corpus)
    for name in ("xqa-bmm2-scale-ignored",):  # a GPU entry: not checked on a CPU
        shutil.copy(PACKAGE_CORPUS / f"{name}.repro.json", corpus)
        shutil.copy(PACKAGE_CORPUS / f"{name}.json", corpus)
    window = json.loads((corpus / "planted-window.json").read_text())
    window["expect"] = {"*": "fixed"}  # it still fails: unexpected
    (corpus / "planted-window.json").write_text(json.dumps(window))
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    code, _, report = run_gate(
        *CORPUS_ARGS, "--corpus", str(corpus), "--plugin", str(PLANTED_FILE),
        "--junit", str(junit), "--summary", str(summary),
    )  # fmt: skip
    assert code == 1
    corpus_report = report["corpus"]
    assert (corpus_report["status"], corpus_report["entries"]) == ("ran", 3)
    [unexpected] = corpus_report["unexpected"]
    assert unexpected.startswith("planted-window: UNEXPECTED: still_fails (expected fixed")
    [ok] = corpus_report["as_expected"]
    assert ok.startswith("planted-fixed: ok: fixed")
    [unchecked] = corpus_report["not_checked"]
    assert unchecked.startswith("xqa-bmm2-scale-ignored: not checked")
    text = summary.read_text()
    assert (
        "Corpus replay: 3 entries, 1 as expected, 1 with an unexpected outcome, 1 not checked "
        "here." in text
    )
    (case,) = [
        c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "corpus replay"
    ]
    failure = case.find("failure")
    assert failure is not None and (failure.text or "").startswith("planted-window: UNEXPECTED")


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_pipe_ends_the_gate_with_141(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = gate.main([*FAST, "--max-cases", "2", "--out", str(tmp_path)], out=_ClosedPipe())
    assert code == 141
    assert capsys.readouterr().err == ""


def test_executable_reports_usage_errors_on_one_line() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gate"), "--shard", "1/x"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == "gate: error: --shard '1/x': expected i/N with integers, e.g. 0/4\n"
