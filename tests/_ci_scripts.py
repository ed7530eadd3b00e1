"""Running a ``ci/`` script in a test: the environment it gets and the call.

``script_env(**extra)``: this environment without the device machine's output conventions
(``OUT``, ``DIFFTEST_GPU_OUT``), with this interpreter's ``python3`` first on ``PATH`` and no
GPU visible, plus ``extra``. ``run_script(script, *args, cwd, env, timeout)``: ``bash script
args`` with its output captured. ``release_env(root, versions, out, **extra)``: stand-in
``flashinfer`` releases in their own sites under ``root`` (nothing staged to install) and the
environment of a script that runs across them (``ci/release_sites.sh``'s variables).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def script_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DIFFTEST_GPU_OUT")}
    return env | {
        "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",  # python3 = this interpreter
        "CUDA_VISIBLE_DEVICES": "",
        **extra,
    }


def run_script(
    script: Path, *args: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def release_env(root: Path, versions: tuple[str, ...], out: Path, **extra: str) -> dict[str, str]:
    sites = root / "sites"
    for version in versions:
        package = sites / version / "flashinfer"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return script_env(
        DIFFTEST_SITES=str(sites),
        DIFFTEST_JIT_ROOT=str(root / "jit"),
        DIFFTEST_STAGE=str(root / "no-stage"),
        DIFFTEST_GPU_OUT=str(out),
        BISECT_VERSIONS=",".join(versions),
        **extra,
    )
