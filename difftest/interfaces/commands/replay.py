"""``difftest replay FILE...``: rerun repros and say per file whether they still fail.

A FILE is a repro file, or a campaign's output folder (every group's repro in it), or with
``--digest D`` a folder whose ``findings.jsonl`` holds the finding of case ``D``. Paths run
isolated by default: a ``CRASH`` or ``HANG`` repro is reported as still failing within the
deadline, never the end of the command.

Exit codes: 0 none still fails; 1 some still fail (or fail differently, or fail where they
did not before); 2 bad input (a truncated or malformed file, an unknown format version, an
unknown path or a plugin not given with ``--plugin``) or a repro none of whose paths can run
here (no GPU, library missing): one line each on stderr, the other files are still replayed.
A repro is never reported fixed, nor passed over with 0, for want of a machine that can run
it. Verdicts use the tool's tolerance; ``--file-tolerance`` uses the file's instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from difftest.execution.executors import StoppedFromOutside
from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session, Settings
from difftest.interfaces.commands._mode_options import add_replay_graph_argument, graphed
from difftest.interfaces.commands._session_options import (
    add_session_arguments,
    path_names,
    session_settings,
)
from difftest.model.errors import DifftestError, ExitCode
from difftest.records.atomic import write_json
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import Repro, load_repro
from difftest.records.run_dir import GROUPS, check_output_file, finding_by_digest, repro_of

HELP = "rerun repro files: still fails, fixed, or fails differently"
MAX_SANITIZER_RECORDS = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="repro files or campaign folders"
    )
    p.add_argument("--paths", default=None, help="replay against these paths (comma-separated)")
    p.add_argument(
        "--digest", default=None, help="with a campaign folder: the finding of this case"
    )
    p.add_argument("--json", type=Path, default=None, help="write the outcomes as JSON here")
    p.add_argument(
        "--file-tolerance",
        action="store_true",
        help="judge with the tolerance recorded in each file instead of the tool's",
    )
    add_session_arguments(p)
    add_replay_graph_argument(p)
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="also rerun each repro under compute-sanitizer memcheck",
    )
    p.add_argument(
        "--sanitize-timeout-s", type=float, default=600.0, help="memcheck time limit per file"
    )


def _targets(file: Path, digest: str | None) -> list[tuple[str, Repro]]:
    """The repros ``file`` stands for, each with the name to report it under."""
    if file.is_dir():
        if digest is not None:
            return [(f"{file}@{digest}", repro_of(finding_by_digest(file, digest), ()))]
        group_files = sorted((file / GROUPS).glob("*.repro.json"))
        if not group_files:
            raise DifftestError(f"{file}: a folder with no {GROUPS}/*.repro.json to replay")
        return [(str(f), load_repro(f)) for f in group_files]
    if digest is not None:
        raise DifftestError(f"--digest needs a campaign folder, not the file {file}")
    return [(str(file), load_repro(file))]


def main(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_output_file(args.json, "--json")
    names = path_names(args.paths)
    base = session_settings(args)
    rows: list[dict[str, Any]] = []
    bad = failing = False
    with handling_signals() as interrupts:
        for file in args.files:
            try:
                targets = _targets(file, args.digest)
            except DifftestError as e:
                print(f"difftest: error: {e}", file=sys.stderr)
                rows.append({"file": str(file), "error": str(e)})
                bad = True
                continue
            for source, repro in targets:
                if interrupts.stopping:
                    break
                settings = base
                try:
                    repro = _as_asked(repro, args)
                except DifftestError as e:
                    print(f"difftest: error: {source}: {e}", file=sys.stderr)
                    rows.append({"file": source, "error": str(e)})
                    bad = True
                    continue
                if args.file_tolerance and repro.tolerance is not None:
                    settings = dataclasses.replace(base, tolerance=repro.tolerance)
                try:
                    outcomes = _replay(repro, settings, source, names, interrupts)
                except StoppedFromOutside as e:  # its worker killed: the command stops
                    print(f"difftest: interrupted: {source}: {e}", file=sys.stderr)
                    break
                except DifftestError as e:
                    print(f"difftest: error: {e}", file=sys.stderr)
                    rows.append({"file": source, "error": str(e)})
                    bad = True
                    continue
                _show_tolerance(repro, settings, source)
                for outcome in outcomes:
                    print(outcome.line())
                    failing |= outcome.verdict.failing
                    rows.append(outcome.to_json())
                if all(o.verdict is Verdict.UNAVAILABLE for o in outcomes):
                    print(
                        f"difftest: error: {source}: none of its paths can run here",
                        file=sys.stderr,
                    )
                    bad = True
                if args.sanitize and not file.is_dir():
                    report = _sanitize(file, list(names or [o.path for o in outcomes]), args)
                    if report is not None:
                        rows.append({"file": source, "sanitizer": report})
    if args.json is not None:
        write_json(args.json, {"outcomes": rows, "interrupted": interrupts.stopping})
    if bad:
        return ExitCode.USAGE
    return ExitCode.FINDINGS if failing or interrupts.stopping else ExitCode.OK


def _as_asked(repro: Repro, args: argparse.Namespace) -> Repro:
    """``repro``, under a graph replay when ``--graph`` asks for one."""
    if not args.graph or repro.case.graph is not None:
        return repro
    if repro.launch:
        raise DifftestError("--graph: a packed launch's repro replays its launch, not a graph")
    return dataclasses.replace(repro, case=graphed(repro.case))


def _replay(
    repro: Repro, settings: Settings, source: str, names: tuple[str, ...] | None, interrupts: Any
) -> list[Any]:
    with Session(settings, interrupts=interrupts) as session:
        return replay_repro(repro, session, source=source, paths=names)


def _show_tolerance(repro: Repro, settings: Settings, source: str) -> None:
    """Say when the file's tolerance differs from the one the verdict used."""
    recorded = repro.tolerance
    if recorded is not None and recorded != settings.tolerance:
        print(
            f"{source}: judged with rtol {settings.tolerance.rtol:g}, atol_ulps "
            f"{settings.tolerance.atol_ulps:g}; the file records rtol {recorded.rtol:g}, "
            f"atol_ulps {recorded.atol_ulps:g} (--file-tolerance uses it)"
        )


def _sanitize(file: Path, paths: list[str], args: argparse.Namespace) -> dict[str, Any] | None:
    from difftest.records.sanitizer import run_under_sanitizer

    report = run_under_sanitizer(file, paths, list(args.plugin), args.sanitize_timeout_s)
    data: dict[str, Any] = report.to_json()
    print(f"{file}: sanitizer: {data.get('summary', '')}")
    for record in list(data.get("records") or [])[:MAX_SANITIZER_RECORDS]:
        where = f" at {record.get('where')}" if record.get("where") else ""
        print(f"  {record.get('kind', '?')}{where}")
    return data
