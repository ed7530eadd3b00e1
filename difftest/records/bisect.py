"""Bisect: rerun repros under several library versions, each in its own interpreter.

For each version a *site* directory holds that release's ``flashinfer`` package (given as
``--site V=DIR``, or found in a kit folder: ``V/``, ``flashinfer-V.tar.xz`` or
``flashinfer_python-V-*.whl``, unpacked once into the work folder). The version's interpreter
(:mod:`difftest.records.bisect_child`) runs with the site first on ``PYTHONPATH`` and its own
JIT cache (``FLASHINFER_WORKSPACE_BASE`` = ``JIT_ROOT/V``), checks that ``flashinfer`` comes from
the site, and replays every repro there (isolated: a crash or a hang is a verdict). Each repro x
version is one :class:`Cell`: still fails, fixed, fails differently, crash, hang, or not runnable
there (with the reason); :func:`exit_code` follows ``difftest replay``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from difftest.model.errors import DifftestError, ExitCode
from difftest.records.bisect_child import CHILD_FORMAT

CellState = Literal[
    "still fails",
    "fixed",
    "fails differently",
    "crash",
    "hang",
    "fails",
    "agrees",
    "not runnable",
    "unfinished",
    "error",
]
FAILING: tuple[CellState, ...] = ("still fails", "fails differently", "crash", "hang", "fails")
_CORPUS_OUTCOME: dict[CellState, str] = {
    "still fails": "still_fails",
    "fixed": "fixed",
    "fails differently": "fails_differently",
    "crash": "fails_differently",
    "hang": "fails_differently",
}
_VERDICT_STATE: dict[str, CellState] = {
    "still_fails": "still fails",
    "fixed": "fixed",
    "fails_differently": "fails differently",
    "fails": "fails",
    "agrees": "agrees",
    "passes": "agrees",
    "unavailable": "not runnable",
}
DEFAULT_TIMEOUT_S = 3600.0
"""How long one version's interpreter may take for all its repros before it is stopped and its
unfinished ones are ``unfinished`` (each path is watched by its own, shorter deadline first: a
kernel that hangs is a ``hang`` verdict; what this limit cuts, e.g. a cold JIT compile, which
the watchdog never caps, was not judged and is recorded nowhere)."""


class BisectError(DifftestError):
    """Bisect cannot start: a site, version list or input is wrong (the message says which)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One repro under one version."""

    state: CellState
    detail: str = ""

    @property
    def failing(self) -> bool:
        return self.state in FAILING

    @property
    def corpus_outcome(self) -> str | None:
        """What a corpus entry records for this version (``None``: nothing was checked)."""
        return _CORPUS_OUTCOME.get(self.state)

    def to_json(self) -> dict[str, str]:
        return {"state": self.state, "detail": self.detail}


def cell_of(row: dict[str, Any]) -> Cell:
    """The cell of one replayed repro, from the child's row."""
    if row.get("error"):
        return Cell(state="error", detail=str(row["error"]))
    state = _VERDICT_STATE.get(str(row.get("verdict")), "error")
    observed = str(row.get("observed") or "")
    if state in ("fails differently", "fails") and observed in ("CRASH", "HANG"):
        state = "crash" if observed == "CRASH" else "hang"
    return Cell(state=state, detail=str(row.get("detail") or ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionSite:
    """Where one version's package is (``site`` ``None``: nowhere, ``problem`` says why)."""

    label: str
    site: Path | None
    problem: str = ""


def _unpacked(archive: Path, into: Path) -> Path:
    """``archive`` (a kit's ``.tar.xz`` site tree, or a pure-Python wheel) unpacked once."""
    done = into / ".difftest-unpacked"
    if done.is_file() and done.read_text() == str(archive.resolve()):
        return into
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as wheel:
            wheel.extractall(into)
    else:
        with tarfile.open(archive) as tar:
            _extract(tar, into)
    done.write_text(str(archive.resolve()))
    return into


def _extract(tar: tarfile.TarFile, into: Path) -> None:
    """Extract a kit's tree, refusing members that would land outside ``into``."""
    root = into.resolve()
    for member in tar.getmembers():
        if not (root / member.name).resolve().is_relative_to(root):
            raise tarfile.TarError(f"member {member.name!r} lands outside {root}")
    try:
        tar.extractall(into, filter="data")  # also refuses links that leave the tree
    except TypeError:  # a Python without extraction filters: names were checked above
        tar.extractall(into)


def find_site(label: str, sites: dict[str, Path], kits: Sequence[Path], work: Path) -> VersionSite:
    """The site of version ``label``: the ``--site`` given for it, else the first kit folder
    that has it (a ``label/`` folder, ``flashinfer-label.tar.xz``, or a wheel of it)."""
    if label in sites:
        site = sites[label]
        if not (site / "flashinfer").is_dir():
            return VersionSite(label=label, site=None, problem=f"{site} has no flashinfer/")
        return VersionSite(label=label, site=site)
    for kit in kits:
        if (kit / label / "flashinfer").is_dir():
            return VersionSite(label=label, site=kit / label)
        archives = [
            kit / f"flashinfer-{label}.tar.xz",
            *sorted(kit.glob(f"flashinfer_python-{label}-*.whl")),
        ]
        for archive in archives:
            if archive.is_file():
                try:
                    return VersionSite(label=label, site=_unpacked(archive, work / "sites" / label))
                except (OSError, tarfile.TarError, zipfile.BadZipFile) as e:
                    return VersionSite(
                        label=label, site=None, problem=f"cannot unpack {archive}: {e}"
                    )
    where = ", ".join(str(k) for k in kits) or "no kit folder given"
    return VersionSite(
        label=label, site=None, problem=f"no site for flashinfer {label} (--site, kits: {where})"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOptions:
    """What each version's interpreter is told, as ``difftest replay`` would be."""

    paths: str | None = None
    plugins: tuple[str, ...] = ()
    device: str | None = None
    isolation: str = "process"
    deadline_s: float | None = None

    def arguments(self) -> list[str]:
        args = [f"--isolation={self.isolation}"]
        if self.paths:
            args.append(f"--paths={self.paths}")
        if self.device:
            args.append(f"--device={self.device}")
        if self.deadline_s is not None:
            args.append(f"--deadline-s={self.deadline_s}")
        for plugin in self.plugins:
            args.append(f"--plugin={plugin}")
        return args


@dataclass(slots=True, kw_only=True)
class VersionRun:
    """One version's interpreter: what it imported and each repro's cell."""

    label: str
    site: Path | None
    jit_cache: Path | None
    version: str = ""
    """The FlashInfer version the interpreter imported (the corpus records this one)."""
    problem: str = ""
    """Why nothing could run under this version."""
    cells: dict[str, Cell] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "version": self.version,
            "site": str(self.site) if self.site else None,
            "jit_cache": str(self.jit_cache) if self.jit_cache else None,
            "problem": self.problem,
        }


def _child_env(site: Path, jit_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    import difftest

    own = str(Path(difftest.__file__).resolve().parents[1])
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(site.resolve()), own, *inherited])
    env["FLASHINFER_WORKSPACE_BASE"] = str(jit_cache)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_version(
    where: VersionSite,
    files: Sequence[str],
    options: ReplayOptions,
    *,
    jit_root: Path,
    work: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> VersionRun:
    """Replay ``files`` in a new interpreter for ``where``'s version."""
    if where.site is None:
        return VersionRun(
            label=where.label,
            site=None,
            jit_cache=None,
            problem=where.problem,
            cells={f: Cell(state="not runnable", detail=where.problem) for f in files},
        )
    jit_cache = jit_root / where.label
    jit_cache.mkdir(parents=True, exist_ok=True)
    out = work / where.label / "replay.json"
    out.unlink(missing_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "difftest.records.bisect_child",
        str(out),
        f"--site={where.site}",
        *options.arguments(),
        *files,
    ]
    run = VersionRun(label=where.label, site=where.site, jit_cache=jit_cache)
    try:
        proc = subprocess.run(
            command,
            env=_child_env(where.site, jit_cache),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        ended, stderr = f"exited with {proc.returncode}", proc.stderr
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired as e:
        ended, code = f"did not finish in {timeout_s:g} s", None
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    report = _read_report(out)
    probe = report.get("flashinfer") or {}
    run.version = str(probe.get("version") or "")
    run.problem = str(probe.get("problem") or "")
    if not report and code == 0:
        run.problem = f"the interpreter wrote no report ({out})"
    if run.problem:
        run.cells = {f: Cell(state="not runnable", detail=run.problem) for f in files}
        return run
    if run.version and run.version != where.label:
        problem = f"the site {where.site} has flashinfer {run.version}, not {where.label}"
        run.problem = problem
        run.cells = {f: Cell(state="not runnable", detail=problem) for f in files}
        return run
    for row in report.get("rows") or []:
        run.cells[str(row.get("file"))] = cell_of(row)
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    for f in files:
        if f in run.cells:
            continue
        detail = f"the interpreter for flashinfer {where.label} {ended}" + (
            f": {last}" if last else ""
        )
        if code is None:  # cut by the time limit: not judged, so not a hang verdict
            run.cells[f] = Cell(state="unfinished", detail=detail + ": not judged")
        elif code == ExitCode.USAGE:
            run.cells[f] = Cell(state="error", detail=last or detail)
        else:
            run.cells[f] = Cell(state="crash", detail=detail)
    return run


def _read_report(out: Path) -> dict[str, Any]:
    try:
        data = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == CHILD_FORMAT else {}


def exit_code(runs: Sequence[VersionRun]) -> ExitCode:
    """As ``difftest replay``: 2 when some repro could not be checked somewhere (bad input, not
    runnable under a version, or cut by the time limit there), else 1 when one still fails (or
    fails differently, crashes or hangs) under some version, else 0."""
    cells = [c for r in runs for c in r.cells.values()]
    if any(c.state in ("error", "not runnable", "unfinished") for c in cells):
        return ExitCode.USAGE
    if any(c.failing for c in cells):
        return ExitCode.FINDINGS
    return ExitCode.OK


def table(runs: Sequence[VersionRun], names: dict[str, str]) -> list[str]:
    """The version x repro table: one row per repro, one column per version, then a line for
    each cell that needs one (why it is not runnable, what it fails with now)."""
    headers = [
        r.label + (f" ({r.version})" if r.version and r.version != r.label else "") for r in runs
    ]
    files = list(names)
    first = max([len("repro"), *(len(names[f]) for f in files)])
    widths = [
        max(len(h), *(len(r.cells[f].state) for f in files))
        for h, r in zip(headers, runs, strict=True)
    ]
    lines = [
        "  ".join(
            ["repro".ljust(first), *(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
        ).rstrip()
    ]
    for f in files:
        cells = [r.cells[f].state.ljust(w) for r, w in zip(runs, widths, strict=True)]
        lines.append("  ".join([names[f].ljust(first), *cells]).rstrip())
    notes = [
        f"  {names[f]} @ {r.label}: {r.cells[f].state}: {r.cells[f].detail}"
        for f in files
        for r in runs
        if r.cells[f].detail and r.cells[f].state not in ("fixed", "agrees")
    ]
    return lines + (["", *notes] if notes else [])
