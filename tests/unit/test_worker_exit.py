"""A worker the parent stops exits at once, without the interpreter's teardown (torch's, the
device context's): the parent waits in ``WorkerProcess.stop`` for nothing but the exit. Told
by an exit handler a plugin registers, which a normal exit runs and the worker's does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _planted import one_torch_thread  # noqa: F401  (autouse)

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution.isolation import IsolatedExecutor
from difftest.model.outcome import Outcome
from difftest.paths import resolve

ROOT = Path(__file__).resolve().parents[2]
MARKER_PLUGIN = str(ROOT / "tests" / "fixtures" / "exit_marker.py")


def test_the_exit_handler_runs_at_a_normal_exit(tmp_path: Path) -> None:
    """The test's own instrument: a process that loads the plugin and ends normally writes
    the marker (so its absence below means the teardown was skipped)."""
    code = f"from difftest.paths.registry import load_plugin; load_plugin({MARKER_PLUGIN!r})"
    env = {"DIFFTEST_EXIT_MARKER": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert len(list(tmp_path.glob("exited-*"))) == 1


def test_a_stopped_worker_exits_without_the_interpreters_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIFFTEST_EXIT_MARKER", str(tmp_path))
    case = next(iter(planned_cases(CampaignConfig(seed=0), "cpu")))[1]
    executor = IsolatedExecutor(resolve(["torch-sdpa"]), "cpu", plugins=(MARKER_PLUGIN,))
    result = executor.evaluate(case)
    assert result.results[0].outcome is Outcome.AGREE
    worker = executor._worker
    assert worker is not None
    executor.close()
    assert worker.process.exitcode == 0  # stopped politely, not killed
    assert list(tmp_path.glob("exited-*")) == []
