"""The gate from a regular (non-editable) install in a fresh virtual environment finds the
corpus difftest ships as package data, and replays it (issue 14).

The venv sees this interpreter's third-party packages (torch, numpy, hypothesis) through a
``.pth`` line, so nothing is downloaded, but not the checkout: difftest itself is built from a
copy of the tracked files and installed into the venv's site-packages. The gate then runs from
an unrelated working directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())
    return dest


@pytest.mark.slow
def test_the_gate_from_a_regular_install_replays_the_shipped_corpus(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy the tracked files from")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = _tracked_copy(tmp_path / "src")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr + install.stdout
    shutil.rmtree(source)  # nothing may come from the source tree from here on
    where = subprocess.run(
        [str(python), "-c", "import difftest; print(difftest.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), where  # a regular install, not the checkout

    work = tmp_path / "elsewhere"
    work.mkdir()
    gate = subprocess.run(
        [
            str(venv / "bin" / "difftest-gate"),
            "--profile",
            "ci",
            "--paths",
            "torch-sdpa",
            "--max-cases",
            "4",
            "--require-corpus",
            "--json",
            "gate.json",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )
    assert gate.returncode == 0, gate.stderr + gate.stdout
    report = json.loads((work / "gate.json").read_text())
    corpus = report["corpus"]
    shipped = [f for f in (ROOT / "difftest" / "corpus").glob("*.json") if ".repro." not in f.name]
    assert corpus["status"] == "ran" and corpus["entries"] == len(shipped) >= 1
    named = {line.split(":")[0] for line in corpus["not_checked"] + corpus["as_expected"]}
    assert named == {f.stem for f in shipped}  # every entry read from the installed package
