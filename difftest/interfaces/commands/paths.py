"""``difftest paths``: every registered path and whether it can run here, the backend each
pins, and what was detected of the installed FlashInfer's API."""

from __future__ import annotations

import argparse
import json

from difftest.machine.device import pick_device
from difftest.model.errors import ExitCode
from difftest.paths import all_paths
from difftest.paths.flashinfer_env import probe_env

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
                "pinned_backend": path.pinned_backend,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return ExitCode.OK
    env = probe_env(device)
    if env.version is not None:
        print(f"flashinfer {env.version} on {env.arch}: {env.api.describe()}")
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        status = "available" if r["available"] else f"unavailable: {r['reason']}"
        pin = f"backend={r['pinned_backend']}" if r["pinned_backend"] else "-"
        print(f"{r['name']:<{width}}  {r['side']:<9}  {pin:<18}  {status}")
    return ExitCode.OK
