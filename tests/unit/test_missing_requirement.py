"""An interpreter without a package difftest needs gets one line and exit 2 from the command
line and from the gate, never an import traceback (a missing library is bad input, not a bug)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# ``sys.modules[name] = None`` makes every later ``import name`` raise ModuleNotFoundError for
# that name, as an interpreter without the package does.
WITHOUT = "import sys; sys.modules[{name!r}] = None; sys.argv = {argv!r}; {call}"
CLI = "from difftest.interfaces.cli import console_main; console_main()"
GATE = "from difftest.interfaces.gate.launcher import console_main; console_main()"


def _run(name: str, argv: list[str], call: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = WITHOUT.format(name=name, argv=argv, call=call)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize("name", ["torch", "numpy", "hypothesis"])
@pytest.mark.parametrize(
    ("argv", "call", "prefix"),
    [
        (["difftest", "paths"], CLI, "difftest: error: "),
        (["difftest", "run", "--device", "cpu", "--budget-s", "5"], CLI, "difftest: error: "),
        (["gate", "--profile", "dev"], GATE, "gate: error: "),
    ],
    ids=["paths", "run", "gate"],
)
def test_a_missing_package_is_one_line_and_exit_2(
    tmp_path: Path, name: str, argv: list[str], call: str, prefix: str
) -> None:
    done = _run(name, argv, call, tmp_path)
    assert done.returncode == 2, done.stderr
    ours = [x for x in done.stderr.splitlines() if x.startswith(prefix)]
    assert ours == [
        f"{prefix}the package {name!r} is not installed in this Python ({sys.executable}); "
        "install difftest with its requirements (README: Install)"
    ]
    assert done.stderr.strip().splitlines()[-1] == ours[0]
    # (torch itself warns on stderr when numpy is missing; that line is torch's, not a traceback)
    assert "Traceback" not in done.stdout + done.stderr


def test_a_missing_package_that_difftest_does_not_need_is_still_a_bug(tmp_path: Path) -> None:
    """Only the requirements are setup errors: an import of anything else that fails inside
    difftest is an internal error, with its traceback."""
    from difftest.interfaces import requirements

    assert requirements.missing_requirement(ModuleNotFoundError("x", name="torch.cuda")) == "torch"
    assert requirements.missing_requirement(ModuleNotFoundError("x", name="matplotlib")) is None
    assert requirements.missing_requirement(ImportError("x", name="torch")) is None
