"""``ci/h200_recover.sh`` on a CPU, with a planted bug: a campaign's finding whose files are
gone is found again by planning the campaign anew from its options, rerun, shrunk, explained
and checked against an independent path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _ci_scripts import run_script, script_env

from difftest.interfaces.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_recover.sh"
PLANTED = ROOT / "tests" / "fixtures" / "planted.py"
RUN_ARGS = "--paths planted-page-stride --device cpu --seed 1 --isolation none"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _lost_finding(tmp_path: Path) -> dict[str, Any]:
    """The first finding of a short campaign on the planted bug, its folder then thrown away
    (the run whose repro files were lost)."""
    lost = tmp_path / "lost"
    code = main(
        ["run", "--plugin", str(PLANTED), *RUN_ARGS.split(), "--max-cases", "12", "--no-shrink",
         "--out", str(lost)]
    )  # fmt: skip
    assert code == 1  # the planted bug is found
    first: dict[str, Any] = json.loads((lost / "findings.jsonl").read_text().splitlines()[0])
    shutil.rmtree(lost)
    return first


def _recover(tmp_path: Path, **which: str) -> Path:
    """``ci/h200_recover.sh`` with ``which`` (INDEX/AROUND or CASES) on the planted bug,
    checked against torch-sdpa; returns its output folder."""
    out = tmp_path / "out"
    env = script_env(
        **which,
        PLUGIN=str(PLANTED),
        CHECK_PATHS="torch-sdpa",
        RUN_ARGS=RUN_ARGS + " --budget-s 60",
        DIFFTEST_GPU_OUT=str(out),
        OMP_NUM_THREADS="1",
    )
    proc = run_script(SCRIPT, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_a_lost_finding_is_planned_again_rerun_and_checked(tmp_path: Path) -> None:
    first = _lost_finding(tmp_path)
    index, digest = first["index"], first["digest"]
    out = _recover(tmp_path, INDEX=str(index), AROUND="1")
    log = (out / "recover.log").read_text()
    assert f'"index": {index}' in log and f'"digest": "{digest}"' in log  # the same case
    report = json.loads((out / "recover.json").read_text())
    (group,) = report["groups"]
    assert group["path"] == "planted-page-stride" and digest in group["digests"]
    assert group["minimal"] is not None  # shrunk
    assert "explain exit 0" in log
    (check,) = json.loads((out / "checks.json").read_text()).values()
    (outcome,) = check["outcomes"]
    # the independent path agrees with the oracle on the repro the planted path fails
    assert outcome["path"] == "torch-sdpa" and outcome["observed"]["kind"] == "AGREE"
    assert (out / "findings.tgz").stat().st_size > 0


def test_listed_cases_are_run_shrunk_and_checked(tmp_path: Path) -> None:
    first = _lost_finding(tmp_path)
    listed = tmp_path / "cases.json"
    listed.write_text(json.dumps([first["case"]]))  # a hand-made case list, as for a root cause
    out = _recover(tmp_path, CASES=str(listed))
    report = json.loads((out / "recover.json").read_text())
    assert report["cases"] == 1
    (group,) = report["groups"]
    assert group["digests"] == [first["digest"]] and group["minimal"] is not None
    (check,) = json.loads((out / "checks.json").read_text()).values()
    assert check["outcomes"][0]["observed"]["kind"] == "AGREE"
