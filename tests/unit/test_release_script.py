"""``ci/h200_release.sh`` on a CPU: one release's steps in the order given, each campaign's
warmup with its own flags, the campaigns' reports in one archive, the log, and at most the
eight files a device call brings back. The GPU adds the kernels (Run 10 of
``docs/validation.md``)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from _ci_scripts import run_script, script_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_release.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _env(tmp: Path) -> dict[str, str]:
    return script_env(
        DIFFTEST_GPU_OUT=str(tmp / "out"),
        DIFFTEST_STAGE=str(tmp / "no-stage"),  # nothing staged: no FlashInfer site
        DIFFTEST_SITES=str(tmp / "sites"),
        DIFFTEST_JIT_ROOT=str(tmp / "jit"),
        OMP_NUM_THREADS="1",
        GRAPH_PATHS="torch-sdpa",
        SKIP_PATHS="torch-sdpa,torch-paged-online",
        CAMPAIGN_BUDGET_S="15",
        TOTAL_S="300",
    )


def test_the_steps_run_in_order_with_their_warmups_and_one_archive(tmp_path: Path) -> None:
    env = _env(tmp_path) | {"SKIP_VARIANTS": "1", "CAMPAIGN_VARIANTS": "2"}
    proc = run_script(
        SCRIPT, "0.7.4", "prebuild,paths,warm,skip,graph,run", cwd=tmp_path, env=env, timeout=400
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    log = (out / "release-0.7.4.log").read_text()
    steps = [line.split(" ", 2)[2] for line in log.splitlines() if line.startswith("== ")]
    order = [
        s.split(":")[0].split(",")[0]
        for s in steps
        if s.split(":")[0].split(",")[0] in ("prebuild", "skip", "graph", "run")
    ]
    assert order == ["prebuild", "skip", "graph", "run"], steps
    # prebuild: the corpus's FMHAv2 entry, alone and in the foreground, before the warmups
    assert "prebuild, alone with 16 jobs: fmha-v2-bmm2-scale-ignored.repro.json" in log
    assert "exit 0 (prebuild)" in log
    assert log.index("exit 0 (prebuild)") < log.index("warmup, side by side")
    assert "skip: difftest run --skip-softmax over torch-sdpa,torch-paged-online" in log
    for warmed in ("corpus", "skip", "graph", "run"):
        assert f"-- warmup {warmed}" in log
    available = [r["name"] for r in json.loads((out / "paths.json").read_text()) if r["available"]]
    assert available == ["torch-sdpa", "torch-paged-online"]
    with tarfile.open(out / "campaigns.tgz") as tar:
        reports = {
            Path(m.name).stem: json.load(tar.extractfile(m))  # type: ignore[arg-type]
            for m in tar.getmembers()
            if m.name.endswith(".json") and m.name.count("/") == 1
        }
    assert set(reports) == {"skip", "graph", "run"}
    for name, on in (("skip", "skip_softmax"), ("graph", "graph"), ("run", None)):
        assert reports[name]["cases"] > 0, name
        assert reports[name]["production_modes"] == {
            m: m == on for m in reports[name]["production_modes"]
        }
    assert set(reports["run"]["paths"]) == set(available)
    # SKIP_VARIANTS sets the skip campaign's compile variants; the others keep CAMPAIGN_VARIANTS
    assert reports["skip"]["max_variants"] == 1
    assert reports["run"]["max_variants"] == reports["graph"]["max_variants"] == 2
    assert len(list(out.iterdir())) <= 8  # what one device call brings back


@pytest.mark.parametrize("args", [["0.7.4", "run,bogus"], ["--help"], []])
def test_bad_arguments_exit_2_with_the_usage(args: list[str], tmp_path: Path) -> None:
    proc = run_script(SCRIPT, *args, cwd=tmp_path, env=_env(tmp_path), timeout=60)
    assert proc.returncode == 2
    assert "unknown step 'bogus'" in proc.stderr or "STEPS, comma-separated" in proc.stderr


@pytest.mark.parametrize("wait", ["1", "0"])
def test_gpu_wait_holds_the_next_step_until_the_gpu_tests_end(wait: str, tmp_path: Path) -> None:
    env = _env(tmp_path) | {
        "GPU_WAIT": wait,
        "GPU_WORKERS": "1",
        "GPU_TESTS": "tests/gpu/test_versions.py",
        "SKIP_VARIANTS": "1",
        "SKIP_BUDGET_S": "15",
    }
    proc = run_script(SCRIPT, "0.7.4", "gpu,skip", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (tmp_path / "out" / "release-0.7.4.log").read_text()
    ended, skip = log.index("waiting for tests/gpu"), log.index("skip: difftest run")
    assert log.count("waiting for tests/gpu") == 1
    assert "test_versions.py" in log[ended:]  # its log follows the wait, wherever that is
    assert (ended < skip) == (wait == "1"), log
