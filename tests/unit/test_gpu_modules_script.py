"""ci/gpu_modules.sh, which carries compiled FlashInfer modules between device calls, run against
a stand-in ``flashinfer`` package (the script reads only its version and JIT directories)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "gpu_modules.sh"
TAG = "flashinfer-0.6.16.post4-90a"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("xz") is None, reason="needs bash and xz"
)


def fake_flashinfer(root: Path) -> Path:
    """A package with flashinfer's version and the three directories the script uses."""
    pkg = root / "site" / "flashinfer"
    workspace = root / "cache" / "0.6.16.post4" / "90a"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.6.16.post4"\n')
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "env.py").write_text(
        "import pathlib\n"
        f"FLASHINFER_WORKSPACE_DIR = pathlib.Path({str(workspace)!r})\n"
        "FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / 'cached_ops'\n"
        f"FLASHINFER_AOT_DIR = pathlib.Path({str(pkg / 'data' / 'aot')!r})\n"
    )
    return root / "site"


def script(verb: list[str], cwd: Path, site: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "OUT": str(out)}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3 = this interpreter
    return subprocess.run(
        ["bash", str(SCRIPT), *verb], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_save_packs_the_jit_libraries_and_restore_installs_them_as_aot(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    ops = tmp_path / "cache" / "0.6.16.post4" / "90a" / "cached_ops"
    for name in ("mod_a", "mod_b"):
        (ops / name).mkdir(parents=True)
        (ops / name / f"{name}.so").write_bytes(name.encode() * 1000)
        (ops / name / f"{name}.cuda.o").write_bytes(b"object")  # not a library: left behind
    out = tmp_path / "out"
    out.mkdir()
    saved = script(["save", "fa3"], tmp_path, site, out)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "saved 2 modules" in saved.stdout
    archive = out / f"{TAG}-fa3.tar.xz"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["mod_a/mod_a.so", "mod_b/mod_b.so"]

    checkout = tmp_path / "checkout"
    (checkout / ".gpu-modules").mkdir(parents=True)
    shutil.copy(archive, checkout / ".gpu-modules")
    shutil.copy(archive, checkout / ".gpu-modules" / "flashinfer-0.6.11-90a-old.tar.xz")
    restored = script(["restore"], checkout, site, out)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert f"installed {TAG}-fa3.tar.xz: 2 modules" in restored.stdout
    assert "skipped flashinfer-0.6.11-90a-old.tar.xz (built for another version" in restored.stdout
    aot = site / "flashinfer" / "data" / "aot"
    assert (aot / "mod_a" / "mod_a.so").read_bytes() == b"mod_a" * 1000
    assert sorted(p.name for p in aot.iterdir()) == ["mod_a", "mod_b"]


def test_save_without_compiled_modules_fails_with_one_line(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    (tmp_path / "cache" / "0.6.16.post4" / "90a" / "cached_ops").mkdir(parents=True)
    proc = script(["save", "x"], tmp_path, site, tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.strip().startswith("gpu_modules: no compiled modules in ")


def test_restore_without_flashinfer_says_so(tmp_path: Path) -> None:
    proc = script(["restore"], tmp_path, tmp_path / "nothing", tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "gpu_modules: flashinfer is not importable"
    assert proc.stderr == ""
