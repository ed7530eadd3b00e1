"""``difftest bisect REPRO... --versions V1,V2,...``: which library versions a bug is in.

Each REPRO (a repro file, a corpus entry, or a corpus folder: all its entries) is replayed
under each version, each version in its own interpreter with its own site directory
(``--site V=DIR``, or found in ``--kits DIR``) and its own FlashInfer JIT cache
(``--jit-cache ROOT``: ``ROOT/V``). The table says per repro and version: still fails, fixed,
fails differently, crash, hang, not runnable there (with the reason), or unfinished (the
version's interpreter was stopped at ``--timeout-s`` before it judged the repro).
``--update-corpus`` writes the outcome seen on each version into the corpus entries (the
version the interpreter imported, never a range; versions where it could not run are left
without one).

Exit codes, as ``difftest replay``'s: 0 every repro is fixed under every version; 1 one still
fails (or fails differently, crashes or hangs) under some version; 2 bad input (an unreadable
repro, an unknown path, a bad ``--site``) or a repro not runnable under some version (no site,
the path unavailable there) or unfinished there: a repro is never passed over with 0 for want
of a version that can run it.
"""

from __future__ import annotations

import argparse
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from difftest.interfaces.commands._session_options import add_session_arguments
from difftest.model.errors import DifftestError
from difftest.records.atomic import write_json
from difftest.records.bisect import (
    DEFAULT_TIMEOUT_S,
    ReplayOptions,
    VersionRun,
    VersionSite,
    exit_code,
    find_site,
    run_version,
    table,
)
from difftest.records.corpus import (
    entry_of_repro,
    given_entries,
    load_entry,
    record_expectations,
)
from difftest.records.repro import REPRO_FORMAT
from difftest.records.run_dir import check_output_file
from difftest.records.untrusted import read_json

HELP = "rerun repros under several library versions: a version x repro table"
LIBRARY = "flashinfer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="REPRO",
        help="repro files, corpus entries (NAME.json) or corpus folders",
    )
    p.add_argument("--versions", required=True, help="the library versions to run, comma-separated")
    p.add_argument(
        "--site",
        action="append",
        default=[],
        metavar="V=DIR",
        help="version V's site directory (the folder holding its flashinfer/); repeatable",
    )
    p.add_argument(
        "--kits",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder with V/ site folders, flashinfer-V.tar.xz site trees or "
        "flashinfer_python-V-*.whl wheels; repeatable",
    )
    p.add_argument(
        "--jit-cache",
        type=Path,
        default=None,
        metavar="ROOT",
        help="each version's FlashInfer JIT cache is ROOT/V (default: "
        "$FLASHINFER_WORKSPACE_BASE or ~, then .cache/difftest-bisect)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path("difftest-out/bisect"),
        help="where unpacked kits and each version's report go (default difftest-out/bisect)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one version's interpreter may take for all repros; it is then stopped "
        "and the repros it had not judged are 'unfinished' (not a verdict: nothing is written "
        f"to the corpus for them; default {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="versions replayed at the same time, each in its own interpreter (default 1: "
        "one after the other; a GPU's JIT builds then share its cores)",
    )
    p.add_argument("--paths", default=None, help="replay against these paths (comma-separated)")
    p.add_argument("--json", type=Path, default=None, help="write the table as JSON here")
    p.add_argument(
        "--update-corpus",
        action="store_true",
        help="write each version's outcome into the corpus entries of the repros",
    )
    add_session_arguments(p)


def _versions(text: str) -> list[str]:
    versions = [v.strip() for v in text.split(",") if v.strip()]
    if not versions:
        raise DifftestError("--versions needs at least one version")
    twice = sorted({v for v in versions if versions.count(v) > 1})
    if twice:
        raise DifftestError(f"--versions names {', '.join(twice)} more than once")
    return versions


def _sites(pairs: list[str], versions: list[str]) -> dict[str, Path]:
    sites: dict[str, Path] = {}
    for pair in pairs:
        label, sep, folder = pair.partition("=")
        if not sep or not label or not folder:
            raise DifftestError(f"--site {pair!r}: expected V=DIR")
        if label not in versions:
            raise DifftestError(f"--site {pair!r}: {label} is not in --versions")
        sites[label] = Path(folder)
    return sites


def _inputs(files: list[Path], update: bool) -> tuple[dict[str, str], dict[str, Path]]:
    """``(names, entries)``: each repro file (as given to the children) with the name the
    table shows, and the corpus entry of each repro that has one."""
    names: dict[str, str] = {}
    owners: dict[str, Path] = {}
    for given in files:
        pairs: list[tuple[Path, Path | None]]
        if given.is_dir():
            pairs = [(e.repro_file, e.file) for e in given_entries(given)]
        elif given.name.endswith(".repro.json") or _is_repro(given):
            pairs = [(given, entry_of_repro(given))]
        elif given.suffix == ".json":
            entry = load_entry(given)
            pairs = [(entry.repro_file, entry.file)]
        else:
            raise DifftestError(f"{given}: not a repro file, corpus entry or corpus folder")
        for repro, entry_file in pairs:
            if not repro.is_file():
                raise DifftestError(f"{repro}: no such repro file")
            key = str(repro.resolve())
            names[key] = entry_file.name.removesuffix(".json") if entry_file else repro.name
            if entry_file is not None:
                owners[key] = entry_file
            elif update:
                raise DifftestError(
                    f"{repro}: not a corpus entry's repro (--update-corpus writes entries only)"
                )
    return names, owners


def _is_repro(file: Path) -> bool:
    """Whether a ``.json`` file not named ``*.repro.json`` is a repro all the same (as
    ``difftest shrink`` and a campaign name theirs), by its ``format``: read as untrusted input,
    so a malformed file is a one-line error here as anywhere."""
    if file.suffix != ".json":
        return False
    data = read_json(file, what="repro file or corpus entry")
    return isinstance(data, dict) and data.get("format") == REPRO_FORMAT


def _jit_root(given: Path | None) -> Path:
    if given is not None:
        return given
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home())
    return base / ".cache" / "difftest-bisect"


def main(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_output_file(args.json, "--json")
    if not (args.timeout_s > 0 and math.isfinite(args.timeout_s)):
        raise DifftestError(f"--timeout-s {args.timeout_s} must be a number > 0")
    if args.deadline_s is not None and not (args.deadline_s > 0 and math.isfinite(args.deadline_s)):
        raise DifftestError(f"--deadline-s {args.deadline_s} must be a number > 0")
    versions = _versions(args.versions)
    sites = _sites(args.site, versions)
    names, owners = _inputs(list(args.files), args.update_corpus)
    options = ReplayOptions(
        paths=args.paths,
        plugins=tuple(str(Path(p).resolve()) if p.endswith(".py") else p for p in args.plugin),
        device=args.device,
        isolation=args.isolation,
        deadline_s=args.deadline_s,
    )
    if args.jobs < 1:
        raise DifftestError(f"--jobs {args.jobs} must be >= 1")
    jit_root = _jit_root(args.jit_cache)
    wheres = [find_site(label, sites, list(args.kits), args.work) for label in versions]
    for where in wheres:
        found = f"site {where.site}" if where.site else where.problem
        print(f"flashinfer {where.label}: {found}", flush=True)

    def run(where: VersionSite) -> VersionRun:
        return run_version(
            where, list(names), options, jit_root=jit_root, work=args.work, timeout_s=args.timeout_s
        )

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each a child process
        runs = list(pool.map(run, wheres))
    print()
    for line in table(runs, names):
        print(line)
    code = exit_code(runs)
    if args.update_corpus:
        _update(runs, names, owners)
    if args.json is not None:
        write_json(args.json, _report(runs, names, owners, code))
    return code


def _update(runs: list[VersionRun], names: dict[str, str], owners: dict[str, Path]) -> None:
    for file, entry in owners.items():
        seen = {
            r.version: outcome
            for r in runs
            if r.version and (outcome := r.cells[file].corpus_outcome) is not None
        }
        if not seen:
            print(f"{names[file]}: nothing recorded (not checked under any version)")
            continue
        record_expectations(entry, LIBRARY, seen)
        facts = ", ".join(f"{v}={o}" for v, o in seen.items())
        print(f"{names[file]}: recorded {LIBRARY} {facts} in {entry}")


def _report(
    runs: list[VersionRun], names: dict[str, str], owners: dict[str, Path], code: int
) -> dict[str, Any]:
    return {
        "format": "difftest-bisect/1",
        "versions": [r.to_json() for r in runs],
        "repros": [
            {
                "file": file,
                "name": name,
                "entry": str(owners[file]) if file in owners else None,
                "cells": {r.label: r.cells[file].to_json() for r in runs},
            }
            for file, name in names.items()
        ],
        "exit": int(code),
    }
