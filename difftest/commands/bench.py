"""``difftest bench``: throughput of a campaign, per path and overall, and where time goes."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from difftest.atomic import write_json
from difftest.campaign import CampaignConfig, planned_cases, run_campaign
from difftest.device import pick_device
from difftest.errors import DifftestError, ExitCode
from difftest.executor import InProcessExecutor
from difftest.paths import resolve
from difftest.warmup import distinct_variants, warm_up
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
        "--cases-per-variant",
        type=int,
        default=None,
        help="cases per compile variant (default: 32 on a GPU, 1 on a CPU)",
    )
    p.add_argument("--no-warmup", action="store_true", help="do not compile ahead")
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
    config = CampaignConfig(
        seed=args.seed,
        budget_s=args.budget_s,
        max_cases=args.max_cases,
        preset=args.preset,
        mode=args.mode,
        out_dir=args.out,
        cases_per_variant=per_variant,
        determinism_every=0,
        plugins=tuple(args.plugin),
    )
    compile_s = 0.0
    if not args.no_warmup:
        horizon = args.max_cases or 256
        plan = (c for _, c in itertools.islice(planned_cases(config, device.type), horizon))
        built = warm_up(distinct_variants(plan, horizon), paths, device)
        compile_s = sum(r.seconds for r in built)
    with InProcessExecutor(paths, device, config.tolerance) as executor:
        report = run_campaign(config, executor)
    wall = max(report.wall_s, 1e-9)
    print(
        f"{report.cases} cases, {len(report.variants)} variants, {wall:.1f}s "
        f"({report.cases / wall:.1f} cases/s); warmup builds {compile_s:.1f}s"
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
        data["cases_per_s"] = report.cases / wall
        write_json(args.json, data)
    return ExitCode.FINDINGS if report.findings else ExitCode.OK
