"""``benchmarks/sample_processes.py``: the CPU its command's processes use, read from ``/proc``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

# a parent that sleeps while its child spins for about a second, then exits with status 3
_COMMAND = """
import multiprocessing, sys, time

def spin():
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=spin)
    child.start()
    child.join()
    sys.exit(3)
"""


def test_a_childs_cpu_is_counted_and_the_status_passed_on(tmp_path: Path) -> None:
    script = tmp_path / "spin.py"
    script.write_text(_COMMAND)
    out = tmp_path / "samples.json"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/sample_processes.py",
            "--every",
            "0.1",
            "--window",
            "1",
            str(out),
            "--",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    data = json.loads(out.read_text())
    parent = str(data["pid"])
    peak = {p: max(s["cpu"].get(p, 0.0) for s in data["samples"]) for p in data["names"]}
    children = {p: c for p, c in peak.items() if p != parent}
    # the spinning child used most of a second of CPU; the sleeping parent little of it
    assert max(children.values()) >= 0.7, peak
    assert peak[parent] < 0.7 * max(children.values())
    assert "CPU share of a core per window" in done.stdout
    assert "child" in done.stdout


def test_options_may_follow_the_output_file(tmp_path: Path) -> None:
    out = tmp_path / "samples.json"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/sample_processes.py",
            str(out),
            "--every",
            "0.05",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(0.3)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    # at 0.05 s a sample over 0.3 s: several samples (at the default 0.5 s, at most one or two)
    assert len(data["samples"]) >= 3, len(data["samples"])


def test_a_command_that_cannot_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/sample_processes.py",
            str(tmp_path / "samples.json"),
            "--",
            str(tmp_path / "no-such-program"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "cannot start" in done.stderr
