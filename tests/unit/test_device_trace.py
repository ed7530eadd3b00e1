"""``difftest.execution.device_trace``: an isolated worker's window of its own activity, written
where ``DIFFTEST_DEVICE_TRACE_DIR`` says, with absolute timestamps (on a CPU the window holds
the host's operators; on a GPU, its kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difftest.execution import device_trace


def test_the_window_is_start_and_length_in_seconds() -> None:
    assert device_trace.window(None) == device_trace.DEFAULT_WINDOW
    assert device_trace.window(" ") == device_trace.DEFAULT_WINDOW
    assert device_trace.window("0,2.5") == (0.0, 2.5)
    for bad in ("5", "a,b", "1,2,3", "-1,2", "1,0"):
        with pytest.raises(device_trace.WindowError, match="DIFFTEST_DEVICE_TRACE_WINDOW"):
            device_trace.window(bad)


def test_nothing_is_traced_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device_trace.DIR_ENV, raising=False)
    assert device_trace.from_env(cuda=False) is None


def _run(tmp_path: Path, window: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
    env = {
        **os.environ,
        device_trace.DIR_ENV: str(tmp_path / "traces"),
        device_trace.WINDOW_ENV: window,
    }
    command = [sys.executable, "-m", "difftest", "run", "--device", "cpu", "--budget-s", "4"]
    before = time.time()
    done = subprocess.run(
        [*command, "--workers", "2", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return done, before, time.time()


def test_each_worker_writes_its_window_on_the_wall_clock(tmp_path: Path) -> None:
    done, before, after = _run(tmp_path, "0.5,1")
    assert done.returncode == 0, done.stderr
    files = sorted((tmp_path / "traces").glob("worker-*.trace.json"))
    assert len(files) == 2, files
    for f in files:
        data = json.loads(f.read_text())
        ops = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        assert ops, f  # the window held the worker's operators
        starts = [data["baseTimeNanoseconds"] + e["ts"] * 1000 for e in ops]
        # absolute: inside the run, after the worker's first half second of it
        assert before * 1e9 < min(starts) and max(starts) < after * 1e9
        # the window's own bounds beside it, on the same clock, around what it recorded
        bounds = json.loads(Path(device_trace.window_file(str(f))).read_text())
        assert bounds["pid"] == int(f.name.split("-")[1].split(".")[0])
        assert before * 1e9 < bounds["open_ns"] <= min(starts)
        assert max(starts) <= bounds["close_ns"] < after * 1e9
        assert bounds["close_ns"] - bounds["open_ns"] >= 1e9  # LENGTH, 1 s
    assert len(list((tmp_path / "traces").glob("worker-*.window.json"))) == 2
    assert not list((tmp_path / "traces").glob("*.partial"))


def test_a_bad_window_stops_the_run_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done, _, _ = _run(tmp_path, "soon")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "DIFFTEST_DEVICE_TRACE_WINDOW='soon'" in done.stderr
