"""Running a ``ci/`` script in a test: the environment it gets and the call.

``script_env(**extra)``: this environment without the device machine's output conventions
(``OUT``, ``DIFFTEST_GPU_OUT``), with this interpreter's ``python3`` first on ``PATH`` and no
GPU visible, plus ``extra``. ``run_script(script, *args, cwd, env, timeout)``: ``bash script
args`` with its output captured.
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
