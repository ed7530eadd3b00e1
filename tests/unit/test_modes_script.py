"""``ci/h200_modes.sh`` on a CPU: its campaigns' plumbing (each mode's run with its own budget
and report, the findings archive, the log) over the CPU paths. What the GPU adds is the
kernels; the lead runs it there (see the script's header)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from _ci_scripts import run_script, script_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_modes.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _env(out: Path) -> dict[str, str]:
    return script_env(
        DIFFTEST_GPU_OUT=str(out),
        OMP_NUM_THREADS="1",
        GRAPH_PATHS="torch-sdpa,torch-paged-online",
        RAGGED_PATHS="torch-sdpa,torch-paged-online",
        SKIP_PATHS="torch-sdpa",
        GRAPH_BUDGET_S="15",
        RAGGED_BUDGET_S="15",
        SKIP_BUDGET_S="15",
        CAMPAIGN_VARIANTS="2",
    )


def test_each_mode_campaign_writes_its_report_and_the_findings_archive(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_script(
        SCRIPT, "installed", "graph,ragged,skip", cwd=tmp_path, env=_env(out), timeout=400
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "modes-installed.log").read_text()
    for what, flag in (("graph", "--graph"), ("ragged", "--ragged"), ("skip", "--skip-softmax")):
        assert f"{what}: difftest run {flag}" in log
        report = json.loads((out / f"{what}-installed.json").read_text())
        assert report["cases"] > 0, what
        assert report["max_variants"] == 2
        on = {"graph": "graph", "ragged": "ragged", "skip": "skip_softmax"}[what]
        assert report["production_modes"] == {m: m == on for m in report["production_modes"]}
    skip = json.loads((out / "skip-installed.json").read_text())
    assert skip["paths"]["torch-sdpa"]["ignored"] == {
        "skip_softmax_threshold_scale_factor": skip["paths"]["torch-sdpa"]["run"]
    }
    with tarfile.open(out / "findings-modes-installed.tgz") as tar:
        names = tar.getnames()
    assert {"graph/groups.json", "ragged/groups.json", "skip/groups.json"} <= set(names)
    assert len(list(out.iterdir())) <= 8  # what one device call brings back


@pytest.mark.parametrize("args", [["installed", "graph,bogus"], ["--help"]])
def test_bad_arguments_exit_2_with_the_usage(args: list[str], tmp_path: Path) -> None:
    proc = run_script(SCRIPT, *args, cwd=tmp_path, env=_env(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2
    assert ("unknown step 'bogus'" if "bogus" in args[-1] else "h200_modes.sh") in proc.stderr
