"""``difftest replay FILE...``: rerun repros and say per file whether they still fail.

Exit codes: 0 none still fails, 1 some still fail (or fail differently), 2 bad input (a
truncated or malformed file, an unknown format version, an unknown path) or a repro none of
whose paths can run here (no GPU, library missing): one line each on stderr, the other files
are still replayed. A repro is never reported fixed, nor passed over with 0, for want of a
machine that can run it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from difftest.machine.device import pick_device
from difftest.model.errors import DifftestError, ExitCode
from difftest.records.atomic import write_json
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import load_repro

HELP = "rerun repro files: still fails, fixed, or fails differently"
MAX_SANITIZER_RECORDS = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="repro files")
    p.add_argument("--paths", default=None, help="replay against these paths (comma-separated)")
    p.add_argument("--json", type=Path, default=None, help="write the outcomes as JSON here")
    p.add_argument(
        "--sanitize",
        action="store_true",
        help="also rerun each repro under compute-sanitizer memcheck",
    )
    p.add_argument(
        "--sanitize-timeout-s", type=float, default=600.0, help="memcheck time limit per file"
    )


def main(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    names = [n for n in args.paths.split(",") if n] if args.paths else None
    rows: list[dict[str, Any]] = []
    bad = failing = False
    for file in args.files:
        try:
            repro = load_repro(file)
            outcomes = replay_repro(
                repro,
                device,
                source=str(file),
                paths=names,
                repro_file=file,
                plugins=args.plugin,
            )
        except DifftestError as e:
            print(f"difftest: error: {e}", file=sys.stderr)
            rows.append({"file": str(file), "error": str(e)})
            bad = True
            continue
        for outcome in outcomes:
            print(outcome.line())
            failing |= outcome.verdict.failing
            rows.append(outcome.to_json())
        if all(o.verdict is Verdict.UNAVAILABLE for o in outcomes):
            print(f"difftest: error: {file}: none of its paths can run here", file=sys.stderr)
            bad = True
        if args.sanitize:
            report = _sanitize(file, names or [o.path for o in outcomes], args)
            if report is not None:
                rows.append({"file": str(file), "sanitizer": report})
    if args.json is not None:
        write_json(args.json, {"outcomes": rows})
    if bad:
        return ExitCode.USAGE
    return ExitCode.FINDINGS if failing else ExitCode.OK


def _sanitize(file: Path, paths: list[str], args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        from difftest.records.sanitizer import run_under_sanitizer
    except ImportError:
        print(f"{file}: sanitizer support not installed")
        return None
    report = run_under_sanitizer(file, paths, list(args.plugin), args.sanitize_timeout_s)
    data: dict[str, Any] = report.to_json()
    print(f"{file}: sanitizer: {data.get('summary', '')}")
    for record in list(data.get("records") or [])[:MAX_SANITIZER_RECORDS]:
        where = f" at {record.get('where')}" if record.get("where") else ""
        print(f"  {record.get('kind', '?')}{where}")
    return data
