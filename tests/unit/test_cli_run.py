"""`difftest run` and `difftest paths`, end to end as a user types them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _planted import difftest

ROOT = Path(__file__).resolve().parents[2]
WRONG = str(ROOT / "tests" / "fixtures" / "wrong_path.py")


def test_run_covers_100_cases_on_two_cpu_paths_and_skips_gpu_paths(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    # A case limit, not the wall clock, so a loaded machine cannot make this flaky; the
    # budget is generous (an idle 2-core machine runs 100 cases in about 3 s).
    proc = difftest(
        "run",
        "--max-cases",
        "100",
        "--budget-s",
        "250",
        "--json",
        str(out),
        "--out",
        str(tmp_path / "o"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    assert report["cases"] == 100
    paths = report["paths"]
    assert paths["torch-sdpa"]["run"] == report["cases"]
    assert paths["torch-paged-online"]["run"] == report["cases"]
    assert paths["torch-sdpa"]["outcomes"] == {"AGREE": report["cases"]}
    gpu = [n for n in paths if n.startswith("fi-")]
    assert gpu, "the FlashInfer paths are registered"
    for name in gpu:
        assert paths[name]["run"] == 0
        assert paths[name]["skipped"] == report["cases"]
        assert report["unavailable"][name]
    assert report["findings"] == []
    assert "no findings" in proc.stdout


def test_a_wrong_plugin_path_is_a_finding_with_its_verdict(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = difftest(
        "run",
        "--plugin",
        WRONG,
        "--paths",
        "torch-sdpa,wrong-long-prefix",
        "--budget-s",
        "20",
        "--max-cases",
        "60",
        "--json",
        str(out),
        "--out",
        str(tmp_path / "o"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr + proc.stdout
    report = json.loads(out.read_text())
    kinds = {(f["path"], f["kind"]) for f in report["findings"]}
    assert kinds == {("wrong-long-prefix", "WRONG")}
    # One bug, one group: it needs a prefix of 40 tokens or more, and scales by 1.5.
    [group] = report["groups"]
    assert (group["path"], group["kind"], group["known"]) == ("wrong-long-prefix", "WRONG", None)
    assert group["trigger"] == ["prefix>32"]
    assert group["count"] == len(report["findings"])
    assert abs(group["fingerprint"]["scale_ratio"] - 1.5) < 0.01
    repro = json.loads(Path(group["minimal"]).read_text())
    assert repro["format"] == "difftest-repro/1"
    assert repro["finding"]["path"] == "wrong-long-prefix"
    assert repro["case"]["batch"]["prefix_lens"] == [40]
    located = {r["path"]: r for r in repro["result"]["results"]}
    assert located["torch-sdpa"]["outcome"] == "AGREE"
    # every finding is in the log, with its case: each replays by digest
    logged = [
        json.loads(line) for line in (tmp_path / "o" / "findings.jsonl").read_text().splitlines()
    ]
    assert {f["digest"] for f in logged} == {f["case_digest"] for f in report["findings"]}
    # a handful of files per group: its repro and the group index, not one per finding
    assert [f.name for f in (tmp_path / "o").rglob("*.repro.json")] == [Path(group["minimal"]).name]
    index = json.loads((tmp_path / "o" / "groups.json").read_text())
    assert [g["id"] for g in index["groups"]] == [group["id"]]
    assert index["groups"][0]["trigger"] == ["prefix>32"]

    # `difftest triage` regroups the run against a corpus that now knows the bug
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "long-prefix.json").write_text(
        json.dumps(
            {
                "format": "difftest-corpus/2",
                "repro": Path(group["minimal"]).name,
                "description": "wrong-long-prefix scales long requests by 1.5",
                "expect": {"*": "still_fails"},
                "known": {
                    "path": "wrong-long-prefix",
                    "kind": "WRONG",
                    "detail": group["detail"],
                    "trigger": ["prefix>32"],
                },
            }
        )
    )
    (corpus / Path(group["minimal"]).name).write_bytes(Path(group["minimal"]).read_bytes())
    unknown = difftest("triage", str(tmp_path / "o"), "--no-known", cwd=tmp_path)
    assert unknown.returncode == 1, unknown.stderr + unknown.stdout
    assert "NEW: wrong-long-prefix WRONG" in unknown.stdout
    regrouped = tmp_path / "triage.json"
    known = difftest(
        "triage",
        str(tmp_path / "o"),
        "--corpus",
        str(corpus),
        "--json",
        str(regrouped),
        cwd=tmp_path,
    )
    assert known.returncode == 0, known.stderr + known.stdout  # only a known bug, as expected
    assert "KNOWN long-prefix" in known.stdout
    data = json.loads(regrouped.read_text())
    [again] = data["groups"]
    assert (again["known"], again["count"], again["trigger"]) == (
        "long-prefix",
        group["count"],
        ["prefix>32"],
    )
    assert data["moved"] == {again["id"]: {group["id"]: group["count"]}}
    assert data["unsorted"] == 0 and data["findings"] == group["count"]
    # any logged finding shrinks by its digest, straight from the run directory
    digest = logged[-1]["digest"]
    shrunk = difftest(
        "shrink", str(tmp_path / "o"), "--digest", digest[:10], "--plugin", WRONG, cwd=tmp_path
    )
    assert shrunk.returncode == 1, shrunk.stderr + shrunk.stdout
    [small] = (tmp_path / "o" / "shrunk").glob("*.json")
    assert json.loads(small.read_text())["case"]["batch"]["prefix_lens"] == [40]
    not_a_run = difftest("triage", str(corpus), cwd=tmp_path)
    assert not_a_run.returncode == 2
    assert not_a_run.stderr.count("\n") == 1 and "not a run directory" in not_a_run.stderr


def test_paths_json_lists_availability(tmp_path: Path) -> None:
    proc = difftest("paths", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    by_name = {r["name"]: r for r in rows}
    assert by_name["torch-sdpa"]["available"] is True
    assert {"name", "available", "reason"} <= set(rows[0])
    assert all(r["reason"] for r in rows if not r["available"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--budget-s", "0"], "--budget-s 0.0 must be a number > 0"),
        (["run", "--paths", "nope"], "unknown path 'nope'"),
        (["run", "--plugin", "no_such_module_xyz"], "plugin 'no_such_module_xyz' failed to import"),
        (["run", "--plugin", "missing.py"], "plugin file not found"),
        (["run", "--preset", "gpt-5"], "unknown preset 'gpt-5'"),
        (["run", "--mode", "decode"], "invalid choice"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = difftest(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def test_sigterm_stops_a_run_between_cases_and_still_reports_them(tmp_path: Path) -> None:
    import signal
    import time

    report = tmp_path / "report.json"
    args = ["run", "--paths", "torch-sdpa", "--budget-s", "300", "--isolation", "none"]
    args += ["--out", str(tmp_path / "out"), "--json", str(report)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "difftest", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "cases" not in proc.stderr.readline():
        pass  # the progress line says the campaign has started
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "interrupted: this covers the cases finished before" in out
    data = json.loads(report.read_text())
    assert data["interrupted"] is True
    assert data["cases"] > 0


@pytest.mark.parametrize("args", [["paths"], ["run", "--max-cases", "20", "--out", "o"]])
def test_a_closed_output_pipe_ends_quietly_with_141(tmp_path: Path, args: list[str]) -> None:
    """``difftest ... | head``: the reader is gone before difftest writes its output."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed:
        proc = subprocess.run(
            [sys.executable, "-m", "difftest", *args],
            cwd=tmp_path,
            stdout=closed,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 141
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
