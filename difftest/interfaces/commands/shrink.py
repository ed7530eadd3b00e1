"""``difftest shrink FILE``: shrink a repro's case while its failure keeps its signature.

Writes the shrunk repro (next to the original unless ``--out``) and prints the original and
shrunk size and the runs spent. A pending repro (``status: running``) is rerun first and its
first failure is shrunk. Exit codes: 1 a shrunk finding was written, 0 nothing fails (or the
failure did not reproduce), 2 bad input, or the failing path cannot run here (no GPU, library
missing, a configuration it does not support).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.execution.executors import InProcessExecutor
from difftest.judgement.tolerance import Tolerance
from difftest.machine.device import pick_device
from difftest.machine.environment import stamp
from difftest.model.errors import ExitCode, SetupError
from difftest.model.outcome import Finding
from difftest.paths.registry import all_paths
from difftest.records.replay import load_recorded_plugins, resolve_paths
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.reduction import ShrinkBudget, shrink

HELP = "shrink a repro to a minimal case that fails the same way"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, metavar="FILE", help="a repro file")
    p.add_argument("--out", type=Path, default=None, help="folder for the shrunk repro")
    p.add_argument("--max-runs", type=int, default=ShrinkBudget().max_runs)
    p.add_argument("--max-seconds", type=float, default=ShrinkBudget().max_seconds)


def main(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    repro = load_repro(args.file)
    source = str(args.file)
    needed = [repro.finding.path] if repro.finding else list(repro.paths)
    problems = load_recorded_plugins(repro, needed, args.file, args.plugin)
    resolve_paths(needed, source, problems)
    registered = {p.name: p for p in all_paths()}
    paths = [registered[n] for n in dict.fromkeys([*needed, *repro.paths]) if n in registered]
    reasons = {n: registered[n].support(repro.case, device) for n in needed}
    if reasons and all(reasons.values()):
        # Shrinking needs the failing path itself: without it every candidate "passes".
        name, reason = next(iter(reasons.items()))
        raise SetupError(f"{source}: path {name} cannot run here: {reason}")
    tolerance = Tolerance()
    with InProcessExecutor(paths, device, tolerance) as executor:
        recorded = repro.path_result()
        if recorded is None or not recorded.outcome.is_finding:
            first = executor.evaluate(repro.case)
            wanted = repro.finding.path if repro.finding else None
            found = [r for r in first.findings() if wanted in (None, r.path)]
            if not found:
                print(f"{source}: nothing fails on a rerun here; nothing to shrink")
                return ExitCode.OK
            recorded = found[0]
        budget = ShrinkBudget(max_runs=args.max_runs, max_seconds=args.max_seconds)
        outcome = shrink(repro.case, recorded, executor, budget=budget)
    info = outcome.report
    if not info.reproduced:
        print(f"{source}: {info.message or 'did not reproduce'}")
        return ExitCode.OK
    verdict = outcome.result.result_for(recorded.path) or recorded
    shrunk = Repro(
        case=outcome.case,
        status="finding",
        paths=tuple(p.name for p in paths),
        finding=Finding(path=verdict.path, kind=verdict.outcome, reason=verdict.reason),
        result=outcome.result,
        tolerance=tolerance,
        environment=stamp(device),
        shrink=info,
        plugins=repro.plugins,
    )
    file = write_repro(args.out or args.file.parent, shrunk)
    passes = ", ".join(f"{k} x{v}" for k, v in info.passes.items()) or "none"
    print(
        f"{source}: shrunk {verdict.path} {verdict.outcome.value}: size {info.original_size} "
        f"-> {info.shrunk_size} in {info.runs} runs ({info.seconds:.1f}s)"
    )
    print(f"  passes: {passes}")
    if info.exhausted:
        print("  the budget ran out: --max-runs / --max-seconds may shrink it further")
    if info.slips:
        print(f"  {len(info.slips)} other failure(s) seen on the way (kept in the repro)")
    print(f"  repro: {file}")
    return ExitCode.FINDINGS
