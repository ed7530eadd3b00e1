"""``difftest run``: a budgeted differential campaign."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path

from difftest.atomic import write_json
from difftest.campaign import CampaignConfig, run_campaign
from difftest.device import pick_device
from difftest.errors import DifftestError, ExitCode
from difftest.executor import Executor, InProcessExecutor
from difftest.isolation import Deadline, IsolatedExecutor
from difftest.paths import resolve
from difftest.report import ProgressLine, print_summary
from difftest.shrink import ShrinkBudget, shrink
from generators.presets import get_preset

HELP = "run a budgeted campaign of random cases through every path and the oracle"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-s", type=float, default=60.0, help="wall-clock budget (default 60)")
    p.add_argument("--max-cases", type=int, default=None, help="stop after this many cases")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    p.add_argument("--preset", default=None, help="model preset (default: any configuration)")
    p.add_argument("--mode", choices=["target_verify", "draft_extend_v2"], default=None)
    p.add_argument("--out", type=Path, default=Path("difftest-out"), help="output directory")
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    p.add_argument(
        "--pack",
        type=int,
        default=None,
        help="cases per kernel launch: each case comes with partners that share its launch "
        "arguments, and each path runs them in one launch; a case not AGREE there is rerun "
        "alone (default: 8 on a GPU, 1 on a CPU)",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=None,
        help="cases per kernel compile variant (default: 32 on a GPU, 1 on a CPU)",
    )
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
    if args.budget_s <= 0:
        raise DifftestError(f"--budget-s {args.budget_s} must be > 0")
    if args.max_cases is not None and args.max_cases < 1:
        raise DifftestError(f"--max-cases {args.max_cases} must be >= 1")
    if args.shrink_runs < 1 or not args.shrink_s > 0:
        raise DifftestError("--shrink-runs must be >= 1 and --shrink-s > 0")
    if args.pack is not None and args.pack < 1:
        raise DifftestError(f"--pack {args.pack} must be >= 1")
    if args.deadline_s is not None and not args.deadline_s > 0:
        raise DifftestError(f"--deadline-s {args.deadline_s} must be > 0")
    if args.deadline_s is not None and args.isolation == "none":
        raise DifftestError("--deadline-s needs --isolation process (nothing watches in-process)")
    if args.preset is not None:
        get_preset(args.preset)
    device = pick_device(args.device)
    paths = resolve(args.paths.split(",") if args.paths else None)
    config = CampaignConfig(
        seed=args.seed,
        budget_s=args.budget_s,
        max_cases=args.max_cases,
        preset=args.preset,
        mode=args.mode,
        out_dir=args.out,
        plugins=tuple(args.plugin),
        cases_per_variant=args.cases_per_variant or (32 if device.type == "cuda" else 1),
        max_variants=args.variants,
        pack=args.pack or (8 if device.type == "cuda" else 1),
    )
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
