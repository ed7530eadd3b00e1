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
    env["ISOLATION_ROUNDS"] = "2"
    proc = run_script(SCRIPT, "isolation", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    log = (out / "speed-0.7.4.log").read_text()
    steps = [line.split(" ", 2)[2] for line in log.splitlines() if line.startswith("== ")]
    assert [s for s in steps if s.startswith("isolation ")] == [
        "isolation process, round 1",
        "isolation none, round 1",
        "isolation none, round 2",  # alternating
        "isolation process, round 2",
    ]
    assert (tmp_path / "jit" / "0.7.4").is_dir()  # its own JIT cache, as the release script's
    figures = json.loads((out / "speed.json").read_text())["isolation"]
    # on a CPU the XQA path runs no case: two empty runs are no measurement of isolation
    assert [r["cases"] for r in figures["rounds"]] == [{"process": 0, "none": 0}] * 2
    assert [r["ratio"] for r in figures["rounds"]] == [None, None]
    assert figures["median_ratio"] is None and figures["median_command_ratio"] is None


def test_the_small_benches_are_measured_after_their_modules_are_built(tmp_path: Path) -> None:
    """FlashInfer's figure is its warm median, so difftest's small benches are warm too: a
    1-second run of the same bench builds in the background, and the measured ones start
    only once every background build has ended."""
    env = script_env(
        SPEED_VERSION="0.7.4",
        DIFFTEST_STAGE=str(tmp_path / "no-stage"),
        DIFFTEST_SITES=str(tmp_path / "sites"),
        DIFFTEST_JIT_ROOT=str(tmp_path / "jit"),
        DIFFTEST_GPU_OUT=str(tmp_path / "out"),
        SMALL_S="5",
        SMALL_PACKS="8",
        OMP_NUM_THREADS="1",
    )
    proc = run_script(SCRIPT, "small", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [
        line.split(" ", 2)[2]
        for line in (tmp_path / "out" / "speed-0.7.4.log").read_text().splitlines()
        if line.startswith("== ")
    ][1:]  # the first names the checkout
    assert steps == [
        "building the small benches' modules in the background (the same bench, 1 s)",
        "waiting for the background builds",
        "small (pack default, warm)",
        "small (pack 1, warm)",
        "small (pack 8, warm)",
    ]
    figures = json.loads((tmp_path / "out" / "speed.json").read_text())
    assert {"bench-small-pack-default", "bench-small-pack-1", "bench-small-pack-8"} <= set(figures)


def _figures_module():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("speed_figures", ROOT / "ci" / "speed_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(wall: float, digest: str, compile_wait: float) -> dict[str, object]:
    return {
        "cases": 200,
        "case_digest": digest,
        "wall_s": wall,
        "timings": {"compile_wait": compile_wait, "compile": 0.5, "kernels": 3.0},
    }


def test_the_summary_compares_isolation_only_on_the_same_cases(tmp_path: Path) -> None:
    figures = _figures_module()
    reports = tmp_path / "reports"
    reports.mkdir()
    # three rounds of the pair; the third's in-process run was cut short (no report)
    for r, (process, none) in enumerate([(40.0, 38.0), (33.0, 30.0), (50.0, None)], start=1):
        (reports / f"run-process-{r}.json").write_text(json.dumps(_run(30.0, "abc", 9.5)))
        (reports / f"run-process-{r}.wall").write_text(f"{process}\n")
        if none is not None:
            (reports / f"run-none-{r}.json").write_text(json.dumps(_run(25.0 + r, "abc", 4.5)))
            (reports / f"run-none-{r}.wall").write_text(f"{none}\n")
    (reports / "bench-small-pack-1.json").write_text(
        json.dumps(
            {
                "cases": 50,
                "wall_s": 10.0,
                "cases_per_s": 5.0,
                "kernel_share": 0.1,
                "timings": {"kernels": 1.0, "shrink": 4.0},
            }
        )
    )
    (reports / "fitest.xml").write_text(
        '<testsuite><testcase time="9.0"/><testcase time="0.01"/><testcase time="0.03"/>'
        '<testcase time="0.02"><skipped/></testcase></testsuite>'
    )
    got = figures.main(reports, tmp_path)
    rounds = got["isolation"]["rounds"]
    assert len(rounds) == 2
    iso = rounds[0]
    assert iso["same_cases"] and iso["command_ratio"] == pytest.approx(40.0 / 38.0)
    assert iso["ratio"] == pytest.approx(30.0 / 26.0)
    assert iso["ratio_less_compile"] == pytest.approx((30.0 - 10.0) / (26.0 - 5.0))
    assert rounds[1]["command_ratio"] == pytest.approx(33.0 / 30.0)
    assert got["isolation"]["median_command_ratio"] == pytest.approx((40 / 38 + 33 / 30) / 2)
    assert got["isolation"]["median_ratio"] == pytest.approx((30 / 26 + 30 / 27) / 2)
    assert got["fitest"]["cases"] == 3 and got["fitest"]["warm_median_s"] == pytest.approx(0.02)
    assert got["bench-small-pack-1_vs_fitest_warm"] == pytest.approx(5.0 * 0.02)
    assert got["bench-small-pack-1"]["phase_share"] == {"kernels": 0.1, "shrink": 0.4}
    assert json.loads((tmp_path / "speed.json").read_text()) == got
    (reports / "run-none-1.json").write_text(json.dumps(_run(25.0, "other", 4.5)))
    got = figures.main(reports, tmp_path)["isolation"]
    iso = got["rounds"][0]
    assert not iso["same_cases"] and iso["ratio"] is None and iso["command_ratio"] is None
    assert got["median_command_ratio"] == pytest.approx(33.0 / 30.0)  # the other round's
