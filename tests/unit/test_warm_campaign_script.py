"""``ci/h200_warm_campaign.sh`` on a CPU, with a CPU path: the warm run has the cold run's
budget (or, ``WARM_BY=cases``, repeats its case count with the same seed), and the summary's
kernel share is the reports' kernel time over their wall time less compiles. The GPU figure
itself comes from a device call (issue 16)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _ci_scripts import run_script, script_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_warm_campaign.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, **knobs: str) -> Path:
    """The script on torch-sdpa with 3 s runs and ``knobs``; its output folder."""
    env = script_env(
        DIFFTEST_GPU_OUT=str(tmp_path / "out"),
        PATHS="torch-sdpa",
        BUDGET_S="3",
        OMP_NUM_THREADS="1",
        **knobs,
    )
    proc = run_script(SCRIPT, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp_path / "out"


def test_the_warm_run_repeats_the_cold_runs_cases_and_the_share_is_computed(
    tmp_path: Path,
) -> None:
    out = _run(tmp_path, WARM_BY="cases", WARM_BUDGET_S="60")
    cold = json.loads((out / "run-cold.json").read_text())
    warm = json.loads((out / "run-warm.json").read_text())
    assert cold["cases"] > 0 and warm["cases"] == cold["cases"]
    figures = json.loads((out / "warm_campaign.json").read_text())
    for name, report in (("cold", cold), ("warm", warm)):
        t = report["timings"]
        compiled = t.get("compile_wait", 0.0) + t.get("compile", 0.0)
        want = t["kernels"] / (report["wall_s"] - compiled)
        assert figures[name]["kernel_share"] == pytest.approx(want)
        assert figures[name]["cases"] == report["cases"]
    log = (out / "warm_campaign.log").read_text()
    assert f"--max-cases {cold['cases']}" in log
    for name in ("cold", "warm"):  # each run's allocator summary; a CPU worker writes none
        summary = (out / f"allocator-{name}.txt").read_text()
        assert "all 0 workers: 0 messages; no counters (not a CUDA device?)" in summary


def test_by_default_the_warm_runs_have_the_cold_runs_budget_and_no_case_limit(
    tmp_path: Path,
) -> None:
    out = _run(tmp_path, WARM_RUNS="2")
    warm = json.loads((out / "run-warm.json").read_text())
    assert warm["cases"] > 0 and warm["stop_reason"] == "the budget is spent"
    log = (out / "warm_campaign.log").read_text()
    assert "--max-cases" not in log and log.count("(budget 3 s") == 3
    first = json.loads((out / "run-warm-1.json").read_text())
    figures = json.loads((out / "warm_campaign.json").read_text())
    assert list(figures) == ["cold", "warm-1", "warm"]
    assert figures["warm"]["cases"] == warm["cases"]
    assert figures["warm-1"]["cases"] == first["cases"] > 0


def test_warm_runs_by_worker_count_and_the_share_at_one_workers_kernel_rate(
    tmp_path: Path,
) -> None:
    # workers sharing a GPU time their kernels on a clock that also counts the others' work:
    # kernel_share_at_w1 prices each run's cases at the one-worker run's kernel time a case
    out = _run(tmp_path, WARM_RUNS="0", WARM_WORKERS="1 2")
    assert not (out / "run-warm.json").exists()
    log = (out / "warm_campaign.log").read_text()
    assert log.count("--workers 1") == 1 and log.count("--workers 2") == 1
    figures = json.loads((out / "warm_campaign.json").read_text())
    assert list(figures) == ["cold", "warm-w1", "warm-w2"]
    one = json.loads((out / "run-warm-w1.json").read_text())
    two = json.loads((out / "run-warm-w2.json").read_text())
    rate = one["timings"]["kernels"] / one["cases"]
    assert figures["warm-w1"]["kernel_s_per_case"] == pytest.approx(rate)
    for name, report in (("warm-w1", one), ("warm-w2", two)):
        assert report["cases"] > 0
        t = report["timings"]
        rest = report["wall_s"] - t.get("compile_wait", 0.0) - t.get("compile", 0.0)
        want = report["cases"] * rate / rest
        assert figures[name]["kernel_share_at_w1"] == pytest.approx(want)


def test_the_run_named_by_profile_run_is_profiled_parent_and_workers(tmp_path: Path) -> None:
    """``PROFILE_RUN=warm-w1``: that run's parent and isolated worker each leave a profile,
    listed by their top functions in profile-warm-w1.txt; the other runs are not profiled.
    ``WARMUP_VARIANTS=2``: the campaign's first two variants built between the cold run and
    the warm ones."""
    out = _run(
        tmp_path, WARM_RUNS="0", WARM_WORKERS="1", PROFILE_RUN="warm-w1", WARMUP_VARIANTS="2"
    )
    log = (out / "warm_campaign.log").read_text()
    cold, warmup, warm = (
        log.index(f" {step}") for step in ("cold (", "warmup (2 variants,", "warm-w1 (")
    )
    assert cold < warmup < warm
    assert "builds for 2 variants" in log[warmup:warm] and "exit 0" in log[warmup:warm]
    assert json.loads((out / "run-warm-w1.json").read_text())["cases"] > 0
    text = (out / "profile-warm-w1.txt").read_text()
    assert "==== parent.prof by cumulative" in text
    assert "==== worker-" in text and "evaluate_pack" in text
    assert not (out / "profile-cold.txt").exists()
