"""``difftest run``: a budgeted differential campaign."""

from __future__ import annotations

import argparse
import dataclasses
import functools

from difftest.campaign.run import run_campaign
from difftest.execution.executors import Executor, InProcessExecutor
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.interfaces.commands._campaign_options import add_campaign_arguments, campaign_config
from difftest.interfaces.console import ProgressLine, print_summary
from difftest.machine.device import pick_device
from difftest.model.errors import DifftestError, ExitCode
from difftest.paths import resolve
from difftest.records.atomic import write_json
from difftest.reduction import ShrinkBudget, shrink

HELP = "run a budgeted campaign of random cases through every path and the oracle"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_campaign_arguments(p)
    p.add_argument(
        "--variants",
        type=int,
        default=None,
        help="stop after this many compile variants (bounds JIT compiles on a GPU)",
    )
    p.add_argument(
        "--isolation",
        choices=["process", "none"],
        default="process",
        help="process (default): paths run in a watched worker, so a crash or a hang is a "
        "finding; none: in this process (faster; a crash ends the run)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds a path may take before it is a HANG, plus a term for the case's work "
        "and the first compile of a variant (default 20 on a CPU, 30 on a GPU)",
    )

    p.add_argument(
        "--no-shrink",
        action="store_true",
        help="write findings as found, without shrinking them to a minimal case",
    )
    p.add_argument(
        "--shrink-runs",
        type=int,
        default=ShrinkBudget().max_runs,
        help=f"runs the shrinker may spend per finding (default {ShrinkBudget().max_runs})",
    )
    p.add_argument(
        "--shrink-s",
        type=float,
        default=ShrinkBudget().max_seconds,
        help=f"seconds the shrinker may spend per finding (default {ShrinkBudget().max_seconds:g})",
    )


def main(args: argparse.Namespace) -> int:
    if args.shrink_runs < 1 or not args.shrink_s > 0:
        raise DifftestError("--shrink-runs must be >= 1 and --shrink-s > 0")
    if args.deadline_s is not None and not args.deadline_s > 0:
        raise DifftestError(f"--deadline-s {args.deadline_s} must be > 0")
    if args.deadline_s is not None and args.isolation == "none":
        raise DifftestError("--deadline-s needs --isolation process (nothing watches in-process)")
    device = pick_device(args.device)
    config = campaign_config(args, device, max_variants=args.variants)
    paths = resolve(args.paths.split(",") if args.paths else None)
    progress = ProgressLine()
    executor: Executor
    if args.isolation == "process":
        deadline = Deadline.for_device(device.type)
        if args.deadline_s is not None:
            deadline = dataclasses.replace(deadline, base_s=args.deadline_s)
        executor = IsolatedExecutor(
            paths, device, config.tolerance, plugins=config.plugins, deadline=deadline
        )
    else:
        executor = InProcessExecutor(paths, device, config.tolerance)
    shrinker = None
    if not args.no_shrink:
        budget = ShrinkBudget(max_runs=args.shrink_runs, max_seconds=args.shrink_s)
        shrinker = functools.partial(shrink, budget=budget)
    try:
        report = run_campaign(config, executor, progress=progress, shrinker=shrinker)
    finally:
        executor.close()
    progress.finish()
    print_summary(report)
    if args.json is not None:
        write_json(args.json, report.to_json())
    return ExitCode.FINDINGS if report.findings or report.interrupted else ExitCode.OK
