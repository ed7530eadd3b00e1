"""``ci/h200_speed.sh`` on a CPU: with ``SPEED_VERSION`` it measures a staged release in its
own site (the log is named for it), and its summary gives an isolation ratio only for two runs
of the same cases. The GPU figures themselves come from a device call (issue 16)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _ci_scripts import run_script, script_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_speed.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_a_staged_release_is_named_and_no_ratio_comes_of_runs_without_cases(
    tmp_path: Path,
) -> None:
    env = script_env(
        SPEED_VERSION="0.7.4",
        DIFFTEST_STAGE=str(tmp_path / "no-stage"),  # nothing staged: the checkout's FlashInfer
        DIFFTEST_SITES=str(tmp_path / "sites"),
        DIFFTEST_JIT_ROOT=str(tmp_path / "jit"),
        DIFFTEST_GPU_OUT=str(tmp_path / "out"),
        OMP_NUM_THREADS="1",
    )
    proc = run_script(SCRIPT, "isolation", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    log = (out / "speed-0.7.4.log").read_text()
    assert "== " in log and "isolation process" in log and "isolation none" in log
    assert (tmp_path / "jit" / "0.7.4").is_dir()  # its own JIT cache, as the release script's
    figures = json.loads((out / "speed.json").read_text())["isolation"]
    # on a CPU the XQA path runs no case: two empty runs are no measurement of isolation
    assert figures["cases"] == {"process": 0, "none": 0}
    assert figures["ratio"] is None
