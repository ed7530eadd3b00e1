"""``difftest paths``: every registered path and whether it can run here."""

from __future__ import annotations

import argparse
import json

from difftest.machine.device import pick_device
from difftest.model.errors import ExitCode
from difftest.paths import all_paths

HELP = "list every kernel path and its availability on this machine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--all", action="store_true", help="include the self-test mutants")


def main(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    rows = []
    for path in all_paths():
        if "mutant" in path.tags and not args.all:
            continue
        reason = path.availability(device)
        rows.append(
            {
                "name": path.name,
                "available": reason is None,
                "reason": reason or "",
                "side": path.side,
                "description": path.description,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return ExitCode.OK
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        status = "available" if r["available"] else f"unavailable: {r['reason']}"
        print(f"{r['name']:<{width}}  {r['side']:<9}  {status}")
    return ExitCode.OK
