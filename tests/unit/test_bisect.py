"""``difftest bisect``: each version in its own interpreter with its own site and JIT cache,
the version x repro table, the exit codes, and per-version corpus expectations.

Each fake release is a site folder holding a different ``flashinfer`` package whose
``versioned_attention`` the plugin ``tests/fixtures/versioned_kernel.py`` runs: the repro's
bug is present in one release, fixed in another, replaced by an exception, a crash or a hang
in others, and one release lacks the function (the path is not available there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from difftest.records.bisect import Cell, VersionSite, cell_of, exit_code, find_site, table
from difftest.records.corpus import load_entry

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "fixtures" / "versioned_kernel.py"
CORPUS = ROOT / "tests" / "corpus"

BEHAVIOURS = {
    "wrong": "return 2 * reference(batch).to(batch.out_dtype)",
    "right": "return reference(batch).to(batch.out_dtype)",
    "raises": "raise RuntimeError('no kernel for this shape')",
    "crash": "os.abort()",
    "hang": "time.sleep(3600)",
}


def fake_release(root: Path, version: str, behaviour: str | None, *, meta: str = "") -> Path:
    """A site folder with a ``flashinfer`` of ``version`` whose kernel does ``behaviour``
    (``None``: it has no kernel)."""
    site = root / f"site-{version}"
    package = site / "flashinfer"
    package.mkdir(parents=True)
    body = [
        "import os, time",
        f"__version__ = {meta or version!r}",
    ]
    if behaviour is not None:
        body += [
            "def versioned_attention(batch):",
            "    from difftest.judgement.tolerance import reference",
            "    seen = os.path.join(os.path.dirname(__file__), 'jit-cache-seen')",
            "    with open(seen, 'w') as f:",
            "        f.write(os.environ['FLASHINFER_WORKSPACE_BASE'])",
            f"    {BEHAVIOURS[behaviour]}",
        ]
    (package / "__init__.py").write_text("\n".join(body) + "\n")
    return site


def make_repro(folder: Path, expect: dict[str, Any] | None = None) -> Path:
    """The planted window repro, its finding moved to ``t-versioned`` (WRONG, tolerance); with
    ``expect``, a corpus entry beside it."""
    data = json.loads((CORPUS / "planted-window.repro.json").read_text())
    text = json.dumps(data).replace('"planted-window"', '"t-versioned"')
    data = json.loads(text)
    data["paths"], data["plugins"] = ["t-versioned"], [str(PLUGIN)]
    folder.mkdir(parents=True, exist_ok=True)
    repro = folder / "windowed.repro.json"
    repro.write_text(json.dumps(data))
    if expect is not None:
        entry = {
            "format": "difftest-corpus/2",
            "repro": repro.name,
            "description": "a fake release's window bug",
            "expect": expect,
        }
        (folder / "windowed.json").write_text(json.dumps(entry))
    return repro


def bisect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_WORKSPACE_BASE"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "difftest", "bisect", *args, "--plugin", str(PLUGIN)),
            *("--work", str(tmp_path / "work"), "--jit-cache", str(tmp_path / "jit")),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def rows(stdout: str) -> dict[str, list[str]]:
    """The table: the repro's row, split at two or more spaces, keyed by its first cell."""
    import re

    out = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] in ("repro", "windowed.repro.json", "windowed"):
            out[cells[0]] = cells[1:]
    return out


def test_the_table_names_every_state_and_a_version_it_cannot_run_makes_it_exit_2(
    tmp_path: Path,
) -> None:
    repro = make_repro(tmp_path / "r")
    sites = [
        fake_release(tmp_path, "1.0", "wrong"),
        fake_release(tmp_path, "1.1", "right"),
        fake_release(tmp_path, "1.2", "raises"),
        fake_release(tmp_path, "1.3", None),
        fake_release(tmp_path, "1.4", "right", meta="9.9"),  # a site of another release
    ]
    given = [
        f"--site={v}={s}" for v, s in zip(("1.0", "1.1", "1.2", "1.3", "1.4"), sites, strict=True)
    ]
    proc = bisect(
        tmp_path,
        str(repro),
        "--versions",
        "1.0,1.1,1.2,1.3,1.4,1.5",
        *given,
        "--isolation",
        "none",
        "--json",
        "table.json",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    table_rows = rows(proc.stdout)
    assert table_rows["repro"] == ["1.0", "1.1", "1.2", "1.3", "1.4 (9.9)", "1.5"]
    assert table_rows["windowed.repro.json"] == [
        "still fails",
        "fixed",
        "fails differently",
        "not runnable",
        "not runnable",
        "not runnable",
    ]
    assert "windowed.repro.json @ 1.2: fails differently: now RAISED (RuntimeError)" in proc.stdout
    assert "@ 1.3: not runnable: flashinfer 1.3 has no versioned_attention" in proc.stdout
    assert (
        "@ 1.4: not runnable: the site " in proc.stdout
        and "has flashinfer 9.9, not 1.4" in proc.stdout
    )
    assert "@ 1.5: not runnable: no site for flashinfer 1.5" in proc.stdout
    report = json.loads((tmp_path / "table.json").read_text())
    assert report["exit"] == 2
    versions = {v["label"]: v for v in report["versions"]}
    assert versions["1.0"]["version"] == "1.0" and versions["1.5"]["site"] is None
    # each version ran in its own interpreter with its own JIT cache
    assert versions["1.0"]["jit_cache"] == str(tmp_path / "jit" / "1.0")
    assert (tmp_path / "jit" / "1.1").is_dir() and not (tmp_path / "jit" / "1.5").exists()
    for version, site in (("1.0", sites[0]), ("1.1", sites[1])):  # as the kernel saw it
        assert (site / "flashinfer" / "jit-cache-seen").read_text() == str(
            tmp_path / "jit" / version
        )


def test_still_failing_somewhere_exits_1_and_the_corpus_records_each_version(
    tmp_path: Path,
) -> None:
    make_repro(tmp_path / "corpus", expect={"flashinfer": {"0.9": "still_fails"}})
    wrong, right = fake_release(tmp_path, "1.0", "wrong"), fake_release(tmp_path, "1.1", "right")
    proc = bisect(
        tmp_path,
        str(tmp_path / "corpus"),
        "--versions=1.0,1.1",
        f"--site=1.0={wrong}",
        f"--site=1.1={right}",
        "--isolation=none",
        "--update-corpus",
        "--jobs=2",  # both versions at once, each in its own interpreter
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows(proc.stdout)["windowed"] == ["still fails", "fixed"]
    entry = load_entry(tmp_path / "corpus" / "windowed.json")
    assert entry.versions("flashinfer") == {
        "0.9": "still_fails",
        "1.0": "still_fails",
        "1.1": "fixed",
    }
    assert "windowed: recorded flashinfer 1.0=still_fails, 1.1=fixed" in proc.stdout


def test_fixed_everywhere_exits_0_and_kits_are_found_by_version(tmp_path: Path) -> None:
    kits = tmp_path / "kits"
    site = fake_release(tmp_path, "2.0", "right")
    site.rename(kits / "2.0") if kits.is_dir() else (kits.mkdir(), site.rename(kits / "2.0"))
    repro = make_repro(tmp_path / "r")
    proc = bisect(
        tmp_path, str(repro), "--versions", "2.0", "--kits", str(kits), "--isolation=none"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows(proc.stdout)["windowed.repro.json"] == ["fixed"]


def test_a_repro_named_as_shrink_names_it_is_bisected_as_a_repro(tmp_path: Path) -> None:
    """``difftest shrink`` writes ``<digest>-<path>-<kind>.json``: bisect reads it by its
    format as a repro, not as a corpus entry (and a corpus entry is still read as one)."""
    site = fake_release(tmp_path, "2.0", "wrong")
    named = make_repro(tmp_path / "r").rename(tmp_path / "r" / "0073052de7cd5664-t-wrong.json")
    proc = bisect(
        tmp_path, str(named), "--versions", "2.0", "--site", f"2.0={site}", "--isolation=none"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows(proc.stdout.replace(named.name, "windowed.repro.json"))["windowed.repro.json"] == [
        "still fails"
    ]
    entry_repro = make_repro(tmp_path / "e", expect={"flashinfer": {"2.0": "still_fails"}})
    proc = bisect(
        tmp_path,
        str(entry_repro.with_name("windowed.json")),
        *("--versions", "2.0", "--site", f"2.0={site}", "--isolation=none"),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows(proc.stdout)["windowed"] == ["still fails"]


def test_a_crash_and_a_hang_under_a_version_are_cells_not_the_end(tmp_path: Path) -> None:
    repro = make_repro(tmp_path / "r")
    crash, hang = fake_release(tmp_path, "3.0", "crash"), fake_release(tmp_path, "3.1", "hang")
    proc = bisect(
        tmp_path,
        str(repro),
        "--versions=3.0,3.1",
        f"--site=3.0={crash}",
        f"--site=3.1={hang}",
        "--deadline-s=3",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows(proc.stdout)["windowed.repro.json"] == ["crash", "hang"]


def test_a_version_cut_by_the_time_limit_is_unfinished_and_records_nothing(
    tmp_path: Path,
) -> None:
    """An interpreter stopped at --timeout-s (on a GPU, a cold compile, which the watchdog never
    caps) judged nothing: the cell is not a hang verdict, the corpus gets nothing for it, and
    the exit is 2 (not checked there), while the other version's outcome is recorded."""
    make_repro(tmp_path / "corpus", expect={"flashinfer": {"0.9": "still_fails"}})
    wrong, slow = fake_release(tmp_path, "5.0", "wrong"), fake_release(tmp_path, "5.1", "hang")
    proc = bisect(
        tmp_path,
        str(tmp_path / "corpus"),
        "--versions=5.0,5.1",
        f"--site=5.0={wrong}",
        f"--site=5.1={slow}",
        "--isolation=none",  # no watchdog: only the interpreter's limit ends it
        "--timeout-s=8",
        "--update-corpus",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert rows(proc.stdout)["windowed"] == ["still fails", "unfinished"]
    assert (
        "windowed @ 5.1: unfinished: the interpreter for flashinfer 5.1 did not finish in 8 s"
        in (proc.stdout)
    )
    entry = load_entry(tmp_path / "corpus" / "windowed.json")
    assert entry.versions("flashinfer") == {"0.9": "still_fails", "5.0": "still_fails"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--versions", "1.0,1.0"], "names 1.0 more than once"),
        (["--versions", "1.0", "--site", "2.0=/x"], "2.0 is not in --versions"),
        (["--versions", "1.0", "--site", "1.0"], "expected V=DIR"),
        (["--versions", "1.0", "--update-corpus"], "not a corpus entry's repro"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from difftest.interfaces.cli import main

    repro = make_repro(tmp_path / "r")
    assert main(["bisect", str(repro), *args, "--work", str(tmp_path / "w")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err, err


def test_cells_follow_the_replay_verdicts() -> None:
    assert cell_of({"verdict": "still_fails", "observed": "WRONG"}).state == "still fails"
    assert cell_of({"verdict": "fails_differently", "observed": "CRASH"}).state == "crash"
    assert cell_of({"verdict": "fails_differently", "observed": "HANG"}).state == "hang"
    assert cell_of({"verdict": "unavailable", "detail": "no GPU"}) == Cell(
        state="not runnable", detail="no GPU"
    )
    assert cell_of({"error": "bad file"}).state == "error"
    assert Cell(state="crash").corpus_outcome == "fails_differently"
    assert Cell(state="not runnable").corpus_outcome is None


def test_a_kit_archive_is_unpacked_once_into_the_work_folder(tmp_path: Path) -> None:
    import tarfile

    site = fake_release(tmp_path, "4.0", "right")
    kits = tmp_path / "kits"
    kits.mkdir()
    with tarfile.open(kits / "flashinfer-4.0.tar.xz", "w:xz") as tar:
        tar.add(site / "flashinfer", arcname="flashinfer")
    found = find_site("4.0", {}, [kits], tmp_path / "work")
    assert found.site == tmp_path / "work" / "sites" / "4.0"
    assert (found.site / "flashinfer" / "__init__.py").is_file()
    (found.site / "marker").write_text("kept")
    assert find_site("4.0", {}, [kits], tmp_path / "work").site == found.site
    assert (found.site / "marker").is_file()  # not unpacked again
    missing = find_site("4.1", {}, [kits], tmp_path / "work")
    assert missing == VersionSite(
        label="4.1", site=None, problem=f"no site for flashinfer 4.1 (--site, kits: {kits})"
    )


def test_exit_codes_follow_replay() -> None:
    from difftest.records.bisect import VersionRun

    def run(*states: str) -> VersionRun:
        return VersionRun(
            label="v",
            site=None,
            jit_cache=None,
            cells={str(i): Cell(state=s) for i, s in enumerate(states)},  # type: ignore[arg-type]
        )

    assert exit_code([run("fixed", "agrees")]) == 0
    assert exit_code([run("fixed"), run("hang")]) == 1
    assert exit_code([run("still fails"), run("not runnable")]) == 2
    lines = table([run("fixed")], {"0": "one"})
    assert lines == ["repro  v", "one    fixed"]


def test_a_versions_repros_replay_cheap_builds_first(tmp_path: Path) -> None:
    """The child replays repros in order of their finding's path's cold build cost, so a slow
    build (FMHAv2's takes minutes) comes last; unknown paths and unreadable files cost 0."""
    from difftest.paths import register, unregister
    from difftest.paths.registry import KernelPath
    from difftest.records.bisect_child import cheap_first

    def on(path: str, name: str) -> str:
        data = json.loads(make_repro(tmp_path / name).read_text())
        text = json.dumps(data).replace('"t-versioned"', f'"{path}"')
        (tmp_path / f"{name}.repro.json").write_text(text)
        return str(tmp_path / f"{name}.repro.json")

    def run(batch: Any) -> Any:
        return batch.new_output()

    register(KernelPath(name="t-slow-build", run=run, build_cost_s=300.0))
    register(KernelPath(name="t-quick-build", run=run, build_cost_s=20.0))
    try:
        slow, quick = on("t-slow-build", "slow"), on("t-quick-build", "quick")
        unknown = on("t-not-registered", "unknown")
        broken = tmp_path / "broken.repro.json"
        broken.write_text("{")
        order = cheap_first([slow, quick, unknown, str(broken)])
        assert order == [unknown, str(broken), quick, slow]
    finally:
        unregister("t-slow-build")
        unregister("t-quick-build")
