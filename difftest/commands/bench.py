"""``difftest bench``: throughput of a campaign, per path and overall, and where time goes."""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from difftest.atomic import write_json
from difftest.campaign import CampaignConfig, planned_cases, run_campaign
from difftest.device import pick_device
from difftest.errors import DifftestError, ExitCode
from difftest.executor import InProcessExecutor
from difftest.paths import resolve
from difftest.warmup import distinct_variants, warm_up, warm_up_in_processes
from generators.presets import get_preset

HELP = "measure cases per second per path and the time split (compile apart)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    p.add_argument("--preset", default=None)
    p.add_argument("--mode", choices=["target_verify", "draft_extend_v2"], default=None)
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
        help="cases per compile variant (default: 32 on a GPU, 1 on a CPU)",
    )
    p.add_argument("--no-warmup", action="store_true", help="do not compile ahead")
    p.add_argument(
        "--warmup-processes",
        type=int,
        default=0,
        help="compile ahead in this many spawned processes (default: one thread per path)",
    )
    p.add_argument("--out", type=Path, default=Path("difftest-out"))
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    if args.budget_s <= 0:
        raise DifftestError(f"--budget-s {args.budget_s} must be > 0")
    if args.preset is not None:
        get_preset(args.preset)
    device = pick_device(args.device)
    paths = resolve(args.paths.split(",") if args.paths else None)
    per_variant = args.cases_per_variant or (32 if device.type == "cuda" else 1)
    if args.pack is not None and args.pack < 1:
        raise DifftestError(f"--pack {args.pack} must be >= 1")
    config = CampaignConfig(
        seed=args.seed,
        budget_s=args.budget_s,
        max_cases=args.max_cases,
        preset=args.preset,
        mode=args.mode,
        out_dir=args.out,
        cases_per_variant=per_variant,
        pack=args.pack or (8 if device.type == "cuda" else 1),
        determinism_every=0,
        plugins=tuple(args.plugin),
    )
    compile_s = draw_ahead_s = 0.0
    source = planned_cases(config, device.type)
    if not args.no_warmup:
        # The cases warmed up for are the campaign's first ones: drawn once, run after.
        clock = time.perf_counter()
        head = list(itertools.islice(source, args.max_cases or 256))
        draw_ahead_s = time.perf_counter() - clock
        variants = distinct_variants((c for _, c in head), len(head))
        if args.warmup_processes > 0:
            built = warm_up_in_processes(
                variants, paths, device, args.warmup_processes, args.plugin
            )
        else:
            built = warm_up(variants, paths, device)
        compile_s = sum(r.seconds for r in built)
        source = itertools.chain(head, source)
    with InProcessExecutor(paths, device, config.tolerance) as executor:
        report = run_campaign(config, executor, cases_override=source)
    wall = max(report.wall_s, 1e-9)
    print(
        f"{report.cases} cases, {len(report.variants)} variants, {wall:.1f}s "
        f"({report.cases / wall:.1f} cases/s); {report.launches} launches; "
        f"warmup builds {compile_s:.1f}s (cases drawn ahead for it in {draw_ahead_s:.1f}s)"
    )
    print(f"{'path':<24}{'cases':>7}{'seconds':>10}{'cases/s':>10}")
    for name, stats in report.paths.items():
        if stats.run:
            rate = stats.run / max(stats.seconds, 1e-9)
            print(f"{name:<24}{stats.run:>7}{stats.seconds:>10.2f}{rate:>10.1f}")
    split = {k: round(v, 3) for k, v in report.timings.items()}
    other = wall - sum(split.values())
    print(
        "time split: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in split.items())
        + f", framework/other {other:.1f}s"
    )
    if args.json is not None:
        data = report.to_json()
        data["warmup_build_s"] = round(compile_s, 3)
        data["draw_ahead_s"] = round(draw_ahead_s, 3)
        data["cases_per_s"] = report.cases / wall
        write_json(args.json, data)
    return ExitCode.FINDINGS if report.findings or report.interrupted else ExitCode.OK
