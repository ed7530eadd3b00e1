"""A repro file is data (issue 19): its plugins never run, its tolerance decides nothing unless
asked for, and what a command writes is checked before anything runs and gets the umask's
mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _planted import (  # noqa: F401
    PLANTED_FILE,
    ROOT,
    corpus_repro,
    difftest,
    one_torch_thread,
    planted_fixture,
)

from difftest.interfaces.cli import main

PLUGIN = ("--plugin", str(PLANTED_FILE))
CPU = ("--device", "cpu", "--isolation", "none")

# -- plugins are never run from a repro ------------------------------------------------------

EVIL = """\
from pathlib import Path
Path({marker!r}).write_text("the repro's plugin ran")
from difftest import register_path
register_path("evil-path", lambda batch: batch.new_output())
"""


def _evil_repro(folder: Path, marker: Path, spec: str) -> Path:
    """A finding of path ``evil-path`` whose repro names the plugin ``spec``, with an
    ``evil.py`` that would create ``marker`` in the repro's folder and in its parent."""
    for where in (folder, folder.parent):
        (where / "evil.py").write_text(EVIL.format(marker=str(marker)))
    data = json.loads(corpus_repro("planted-window", folder).read_text())
    data["plugins"] = [spec]
    data["finding"]["path"] = "evil-path"
    data["signature"] = None
    data["paths"] = ["evil-path"]
    data["result"]["results"][0]["path"] = "evil-path"
    file = folder / "evil.repro.json"
    file.write_text(json.dumps(data))
    (folder / "planted-window.repro.json").unlink()
    return file


@pytest.mark.parametrize("spec", ["evil.py", "./evil.py", "../evil.py", "ABSOLUTE"])
@pytest.mark.parametrize("where", ["repro-folder", "elsewhere"])
def test_a_repros_plugin_is_never_imported(spec: str, where: str, tmp_path: Path) -> None:
    folder = tmp_path / "parent" / "repro"
    folder.mkdir(parents=True)
    marker = tmp_path / "PWNED"
    if spec == "ABSOLUTE":
        spec = str(folder / "evil.py")
    file = _evil_repro(folder, marker, spec)
    cwd = folder if where == "repro-folder" else tmp_path
    for command in (
        ["replay", str(file), "--device", "cpu"],
        ["explain", str(file), "--device", "cpu"],
        ["shrink", str(file), "--device", "cpu", "--out", str(tmp_path / "out")],
        ["export", str(file), "-o", str(tmp_path / "script.py")],
    ):
        proc = difftest(*command, cwd=cwd)  # python -m difftest: the cwd is on sys.path
        assert not marker.exists(), f"{command[0]} ran the repro's plugin"
        assert proc.returncode == 2, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert "evil-path" in line and "evil.py" in line and "--plugin" in line, line
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "script.py").exists()


def test_a_repros_plugin_runs_when_the_command_line_names_it(tmp_path: Path) -> None:
    # The same file works once the user passes the plugin: the refusal is the only gate.
    folder = tmp_path / "repro"
    folder.mkdir()
    marker = tmp_path / "RAN"
    file = _evil_repro(folder, marker, "evil.py")
    proc = difftest("replay", str(file), "--plugin", str(folder / "evil.py"), cwd=tmp_path)
    assert marker.exists(), proc.stderr
    assert "not registered" not in proc.stderr


# -- the tolerance is the tool's -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("rtol", 1e308, "1e+308"),
        ("atol_ulps", 1e308, "1e+308"),
        ("rtol", float("inf"), "Infinity"),
        ("atol_ulps", float("inf"), "Infinity"),
        ("rtol", -1.0, "-1.0"),
        ("rtol", 17, "17"),
    ],
)
def test_a_tolerance_out_of_range_is_refused_naming_the_field(
    field: str, value: float, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-window", tmp_path)
    data = json.loads(file.read_text())
    data["tolerance"][field] = value
    file.write_text(json.dumps(data))  # json writes inf as Infinity
    assert text in file.read_text()
    for command in ("replay", "explain", "shrink"):
        assert main([command, str(file), *PLUGIN, *CPU]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"tolerance.{field}" in line, line
    assert main(["replay", str(file), *PLUGIN, *CPU, "--file-tolerance"]) == 2


def _replay_json(file: Path, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """``difftest replay FILE --json`` in this process: the exit code and the one outcome."""
    out = tmp_path / "outcome.json"
    code = main(["replay", str(file), *PLUGIN, *CPU, "--json", str(out), *extra])
    [row] = json.loads(out.read_text())["outcomes"]
    return code, row


def test_an_edited_tolerance_in_range_is_shown_not_used(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-window", tmp_path)
    data = json.loads(file.read_text())
    data["tolerance"] = {"rtol": 15, "atol_ulps": 64}
    file.write_text(json.dumps(data))
    code, tool = _replay_json(file, tmp_path)
    out = capsys.readouterr().out
    assert code == 1 and tool["verdict"] == "still_fails"  # judged as before the edit
    assert "judged with rtol 2, atol_ulps 2; the file records rtol 15, atol_ulps 64" in out
    code, own = _replay_json(file, tmp_path, "--file-tolerance")
    assert "judged with" not in capsys.readouterr().out
    tool_bound = tool["result"]["metrics"]["max_bound"]
    file_bound = own["result"]["metrics"]["max_bound"]
    assert file_bound > 5 * tool_bound  # the file's wider bound was used, as asked
    assert code == 1  # (the planted bug is far past even that)


def test_a_path_that_never_failed_agrees_and_is_never_fixed(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-window", tmp_path)
    assert main(["replay", str(file), *PLUGIN, *CPU, "--paths", "torch-sdpa"]) == 0
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line == f"{file}: agrees: torch-sdpa: agrees (as recorded)"
    assert "fixed" not in line


# -- outputs are checked up front and written with the umask ---------------------------------


class _SessionStarted(Exception):
    pass


def _no_session(*args: object, **kwargs: object) -> None:
    raise _SessionStarted("a session (a worker, a campaign) started before the check")


def _refused_up_front(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = set(cwd.iterdir())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("difftest.interfaces.commands.run.Session", _no_session)
        code = main(argv)
    err = capsys.readouterr()
    assert code == 2, err.out + err.err
    assert "cases" not in err.out, err.out
    assert set(cwd.iterdir()) == before, "a folder or file was created"
    [line] = err.err.strip().splitlines()
    return line


def test_run_refuses_an_existing_file_as_its_out_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    main(["paths"])  # the first command imports them all: not the check's cost
    capsys.readouterr()
    for isolation in ("process", "none"):
        line = _refused_up_front(
            ["run", "--out", "/etc/passwd", "--isolation", isolation, "--max-cases", "3"],
            tmp_path,
            capsys,
        )
        assert line == "difftest: error: --out /etc/passwd: exists and is not a folder"


@pytest.mark.parametrize("where", ["under-a-file", "proc", "sys", "fifo", "folder"])
def test_run_refuses_an_unwritable_json_before_any_case(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Root passes every permission check (os.access), and /proc or /sys refuse writes
    # whatever the bits say: the check makes (and removes) a file where the report goes.
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "a-file").write_text("")
    os.mkfifo(tmp_path / "a-fifo")
    target = {
        "under-a-file": tmp_path / "a-file" / "report.json",
        "proc": Path("/proc/difftest-no-such-folder/report.json"),
        "sys": Path("/sys/report.json"),
        "fifo": tmp_path / "a-fifo",
        "folder": tmp_path,
    }[where]
    if not target.parent.parent.exists():
        pytest.skip(f"no {target.parent.parent} here")
    monkeypatch.chdir(work)
    main(["paths"])
    capsys.readouterr()
    out = work / "campaign"
    line = _refused_up_front(
        ["run", "--json", str(target), "--out", str(out), "--max-cases", "3"], work, capsys
    )
    assert line.startswith("difftest: error: --json "), line
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_run_refuses_a_read_only_folder_for_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    monkeypatch.chdir(tmp_path)
    main(["paths"])
    capsys.readouterr()
    line = _refused_up_front(
        ["run", "--json", str(locked / "r.json"), "--out", str(tmp_path / "o"), "--max-cases", "1"],
        tmp_path,
        capsys,
    )
    assert "is not writable" in line


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_get_the_mode_the_umask_gives(umask: int, mode: int, tmp_path: Path) -> None:
    # A fresh process with the umask set before it starts: a campaign's files and a shrunk
    # repro are 0o666 less the umask, not the temporary file's private 0o600.
    script = (
        "import os, sys\n"
        f"os.umask({umask:#o})\n"
        "from difftest.interfaces.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }
    out = tmp_path / "campaign"
    argv = [
        "run",
        *PLUGIN,
        "--paths",
        "planted-bmm2",
        "--max-cases",
        "20",
        "--no-shrink",
        *CPU,
        "--out",
        str(out),
        "--json",
        str(tmp_path / "report.json"),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    repro = next((out / "groups").glob("*.repro.json"))
    shrunk = tmp_path / "shrunk"
    shrink = ["shrink", str(repro), *PLUGIN, *CPU, "--max-runs", "3", "--out", str(shrunk)]
    proc = subprocess.run(
        [sys.executable, "-c", script, *shrink],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    files = [
        tmp_path / "report.json",
        out / "findings.jsonl",
        out / "running.jsonl",
        repro,
        *shrunk.glob("*.json"),
    ]
    assert len(files) == 5
    for file in files:
        assert file.stat().st_mode & 0o777 == mode, (file, oct(file.stat().st_mode))
