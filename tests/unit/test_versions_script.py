"""``ci/h200_versions.sh`` on a CPU, against two stand-in ``flashinfer`` releases in their own
sites: each version's steps run with its site first on the module path and its own JIT cache,
and bisect runs the corpus across both (on a CPU every entry is not runnable: exit 2, and no
expectation is written). What the GPU adds is the kernels; the plumbing is checked here."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from _ci_scripts import release_env, run_script, script_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_versions.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_both_versions_each_with_its_site_and_cache_then_bisect_across_them(
    tmp_path: Path,
) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "difftest" / "corpus", corpus)
    before = {f.name: f.read_text() for f in corpus.glob("*.json")}
    out = tmp_path / "out"
    env = release_env(tmp_path, ("1.0", "1.1"), out, DIFFTEST_CORPUS=str(corpus), RUN_BUDGET_S="4")
    sites = tmp_path / "sites"
    proc = run_script(SCRIPT, "both", "paths,run,bisect", cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "versions-both.log").read_text()
    for version in ("1.0", "1.1"):
        assert f"flashinfer {version} from {sites / version / 'flashinfer'}" in log
        paths = json.loads((out / f"paths-{version}.json").read_text())
        assert {r["name"] for r in paths if r["available"]} == {"torch-sdpa", "torch-paged-online"}
        run = json.loads((out / f"run-{version}.json").read_text())
        assert set(run["paths"]) == {"torch-sdpa", "torch-paged-online"}  # every available one
        assert (tmp_path / "jit" / version).is_dir()
    report = json.loads((out / "bisect.json").read_text())
    assert report["exit"] == 2 and [v["version"] for v in report["versions"]] == ["1.0", "1.1"]
    cells = [c for r in report["repros"] for c in r["cells"].values()]
    assert len(cells) == 2 * len([n for n in before if not n.endswith(".repro.json")])
    assert all(c["state"] == "not runnable" and "needs a CUDA GPU" in c["detail"] for c in cells)
    assert {f.name: f.read_text() for f in corpus.glob("*.json")} == before  # nothing checked
    with tarfile.open(out / "corpus-updated.tgz") as tar:
        names = sorted(Path(n).name for n in tar.getnames() if n.endswith(".json"))
    assert names == sorted(n for n in before if not n.endswith(".repro.json"))


def test_steps_that_total_s_leaves_no_time_for_are_skipped_saying_so(tmp_path: Path) -> None:
    """TOTAL_S bounds the whole script (the device tool stops a call at 600 s, and only what is
    under $OUT by then comes back): a step with under 30 s left is not started, and the log
    says why."""
    package = tmp_path / "sites" / "1.0" / "flashinfer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '1.0'\n")
    out = tmp_path / "out"
    env = script_env(
        DIFFTEST_SITES=str(tmp_path / "sites"),
        DIFFTEST_JIT_ROOT=str(tmp_path / "jit"),
        DIFFTEST_STAGE=str(tmp_path / "no-stage"),
        DIFFTEST_GPU_OUT=str(out),
        BISECT_VERSIONS="1.0",
        TOTAL_S="45",  # 25 s after packing-up time: under the 30 s a step needs
    )
    proc = run_script(SCRIPT, "1.0", "run,bisect", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "versions-1.0.log").read_text()
    assert log.count("skipped: ") == 3, log  # the warmup, the run, bisect
    assert "s left of TOTAL_S=45" in log
    assert not (out / "run-1.0.json").exists() and not (out / "bisect.json").exists()
