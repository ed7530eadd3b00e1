"""What the run session guarantees every command, each a defect of an earlier version:

- replay and shrink of a ``CRASH`` repro and of a ``HANG`` repro report it (exit 1) within the
  deadline instead of dying with the path or hanging with it;
- an interrupted gate never passes: SIGINT makes it stop, say INTERRUPTED with its counts, mark
  the JUnit file with an error and exit non-zero;
- a run in which no case ran on any chosen path is a setup error (exit 2), not "no findings";
- SIGTERM sent to a command's whole process group (as ``timeout`` and ``kill -- -PGID`` send
  it) stops it as a SIGTERM to the command alone does: the launch in flight finishes, and no
  isolated worker dies of the signal, so no finding is made of the stop itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Finding, Outcome
from difftest.records.repro import Repro, write_repro

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
CASE = Case(
    attention=AttentionConfig(num_qo_heads=1, num_kv_heads=1, head_dim=16, page_size=4),
    batch=BatchSpec(mode="target_verify", prefix_lens=(3,), q_len=2),
)
ENV = {
    "PYTHONPATH": str(ROOT),
    "PATH": "/usr/bin:/bin",
    "CUDA_VISIBLE_DEVICES": "",
    "OMP_NUM_THREADS": "1",
}


def difftest(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "difftest", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def _repro(folder: Path, path: str, kind: Outcome) -> Path:
    return write_repro(
        folder,
        Repro(
            case=CASE,
            status="finding",
            paths=(path,),
            finding=Finding(path=path, kind=kind, reason="recorded"),
            plugins=(PLUGIN,),
        ),
    )


@pytest.mark.parametrize(("path", "kind"), [("bad-abort", "CRASH"), ("bad-hang", "HANG")])
def test_replay_of_a_crash_or_hang_repro_reports_it_within_the_deadline(
    tmp_path: Path, path: str, kind: str
) -> None:
    file = _repro(tmp_path, path, Outcome(kind))
    start = time.monotonic()
    proc = difftest("replay", "--plugin", PLUGIN, "--deadline-s", "2", str(file), cwd=tmp_path)
    seconds = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(f"{file}: still fails: {path}: {kind}"), proc.stdout
    assert "Traceback" not in proc.stderr
    assert seconds < 60  # a worker start-up, the deadline, a stop: never forever


@pytest.mark.parametrize(("path", "kind"), [("bad-abort", "CRASH"), ("bad-hang", "HANG")])
def test_shrink_of_a_crash_or_hang_repro_shrinks_it_in_isolation(
    tmp_path: Path, path: str, kind: str
) -> None:
    file = _repro(tmp_path, path, Outcome(kind))
    proc = difftest(
        "shrink", "--plugin", PLUGIN, "--deadline-s", "2", "--max-runs", "4",
        str(file), "--out", str(tmp_path / "small"),
        cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr + proc.stdout
    assert f"shrunk {path} {kind}: size {CASE.size()} -> " in proc.stdout
    [shrunk] = (tmp_path / "small").glob("*.json")
    data = json.loads(shrunk.read_text())
    assert data["finding"]["kind"] == kind and data["shrink"]["runs"] <= 4


def test_a_run_in_which_no_case_ran_on_any_chosen_path_is_a_setup_error(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    proc = difftest(
        "run", "--plugin", PLUGIN, "--paths", "never-supported", "--max-cases", "5",
        "--out", str(tmp_path / "o"), "--json", str(report),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "health check no_case_ran (error): 5 cases, none run on any chosen path" in proc.stdout
    assert "supports no case at all" in proc.stdout
    assert json.loads(report.read_text())["health"][0]["check"] == "no_case_ran"
    # No chosen path can run here at all (a GPU path on a CPU): the same.
    proc = difftest("run", "--paths", "fi-decode-xqa", "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no case could be run" in proc.stdout and "needs a CUDA GPU" in proc.stdout


def test_a_run_whose_budget_ends_before_its_first_case_says_so(tmp_path: Path) -> None:
    # the first case sleeps past the whole budget: nothing ran, and the reason is the budget
    # (a GPU run waiting on its first module builds), not unsupported paths
    mark = tmp_path / "slept"
    proc = subprocess.run(
        [sys.executable, "-m", "difftest", "run", "--plugin", PLUGIN, "--paths", "slow-once",
         "--budget-s", "1", "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**ENV, "DIFFTEST_SLOW_ONCE_MARK": str(mark), "DIFFTEST_SLOW_ONCE_S": "6"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert mark.exists()  # the case did start
    line = next(x for x in proc.stdout.splitlines() if x.startswith("health check no_case_ran"))
    assert "0 cases: the 1s budget was spent before the first case ended" in line
    assert "raise --budget-s" in line and "support" not in line
    health = json.loads((tmp_path / "r.json").read_text())["health"]
    assert [h["check"] for h in health] == ["no_case_ran"]


def test_an_interrupted_gate_never_passes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    junit, summary, report = tmp_path / "j.xml", tmp_path / "s.md", tmp_path / "g.json"
    gate = subprocess.Popen(
        [sys.executable, str(ROOT / "ci" / "gate"), "--profile", "ci", "--paths", "torch-sdpa",
         "--preset", "any", "--max-cases", "800", "--isolation", "none", "--no-corpus",
         "--out", str(out), "--junit", str(junit), "--summary", str(summary),
         "--json", str(report)],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = out / "shard-000" / "any" / "running.jsonl"
    try:
        for _ in range(600):
            if log.exists() and len(log.read_text().splitlines()) > 4:
                break
            if gate.poll() is not None:
                break
            time.sleep(0.1)
        assert gate.poll() is None, "the gate ended before it was interrupted"
        gate.send_signal(signal.SIGINT)
        time.sleep(0.2)
        gate.send_signal(signal.SIGINT)
        stdout, stderr = gate.communicate(timeout=120)
    finally:
        if gate.poll() is None:
            os.kill(gate.pid, signal.SIGKILL)
    assert gate.returncode == 1, stderr
    assert "PASS" not in stdout
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and 0 < data["cases"] < 800
    assert data["verdict"].startswith(f"INTERRUPTED after {data['cases']} cases")
    assert summary.read_text().startswith(f"### difftest gate: INTERRUPTED after {data['cases']}")
    errors = [e for e in ET.parse(junit).getroot().iter("error") if e.get("type") == "INTERRUPTED"]
    assert len(errors) == 1


def _sleeping(
    tmp_path: Path, command: str, *, sleep_s: float
) -> tuple[subprocess.Popen[str], Path, Path]:
    """``difftest run`` (or ``replay`` of a repro) of the ``slow-once`` path in a session of its
    own, returned once the path has begun its first call's ``sleep_s`` of sleep in the isolated
    worker; with the run's output folder and JSON report."""
    mark = tmp_path / "slept"
    env = {**ENV, "DIFFTEST_SLOW_ONCE_MARK": str(mark), "DIFFTEST_SLOW_ONCE_S": str(sleep_s)}
    out, report = tmp_path / "out", tmp_path / "report.json"
    if command == "run":
        args = ["run", "--device", "cpu", "--plugin", PLUGIN, "--paths", "slow-once"]
        args += ["--budget-s", "300", "--out", str(out), "--json", str(report)]
    else:
        repro = _repro(tmp_path, "slow-once", Outcome.WRONG)
        args = ["replay", "--plugin", PLUGIN, str(repro), "--json", str(report)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "difftest", *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for an event (the path began its sleep), not timing
    if not (mark.exists() and proc.poll() is None):
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the path never ran (exit {proc.poll()})")
    return proc, out, report


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux: from ``/proc``)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("who", ["workers", "everyone"])
@pytest.mark.parametrize("command", ["run", "replay"])
def test_sigterm_to_the_workers_is_a_stop_not_a_crash(
    tmp_path: Path, command: str, who: str
) -> None:
    """``pkill -f difftest`` signals the command and each isolated worker on its own (they are
    in process groups of their own), and ``kill`` may signal a worker alone: a worker killed by
    SIGTERM in the middle of a path was a ``CRASH`` finding of that path ("worker process
    killed by SIGTERM while running this path"). No kernel fault sends SIGTERM: the command now
    stops as interrupted, without a verdict for what the worker ran."""
    proc, out, report = _sleeping(tmp_path, command, sleep_s=30)
    try:
        workers = _descendants(proc.pid)
        assert workers
        for pid in [*workers, *([proc.pid] if who == "everyone" else [])]:
            os.kill(pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in stderr, stderr
    assert "CRASH" not in stdout and "killed by SIGTERM" not in stdout, stdout
    assert proc.returncode == 1, (stdout, stderr)
    data = json.loads(report.read_text())
    assert data["interrupted"] is True
    if command == "run":
        assert data["findings"] == [] and data["groups"] == []
        assert not (out / "findings.jsonl").exists() or not (out / "findings.jsonl").read_text()
        assert data["stop_reason"].startswith("interrupted (SIGTERM")
    else:
        assert data["outcomes"] == [], data  # nothing judged: no verdict, no "fails differently"
        assert "interrupted" in stderr


@pytest.mark.parametrize("command", ["run", "replay"])
def test_sigterm_to_the_whole_process_group_stops_the_command_without_a_finding(
    tmp_path: Path, command: str
) -> None:
    """``timeout 8 difftest run`` once recorded a NEW torch-paged-online CRASH group ("worker
    process killed by SIGTERM while running this path", with a repro file), and a replay cut
    by ``timeout`` printed "fails differently: now CRASH": the signal reached the isolated
    worker in the middle of a path. Here the path sleeps in its first call; the group gets
    SIGTERM while it does."""
    proc, out, report = _sleeping(tmp_path, command, sleep_s=2)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in stderr, stderr
    assert "CRASH" not in stdout and "killed by SIGTERM" not in stdout, stdout
    data = json.loads(report.read_text())
    assert data["interrupted"] is True
    if command == "run":
        assert proc.returncode == 1, stderr
        assert data["cases"] >= 1 and data["findings"] == []  # the slept case, judged
        assert not (out / "findings.jsonl").exists() or not (out / "findings.jsonl").read_text()
    else:
        assert proc.returncode == 1, stderr
        assert [row["verdict"] for row in data["outcomes"]] == ["fixed"], data  # it agrees
