"""``difftest bench``: throughput of a campaign, per path and overall, and where time goes."""

from __future__ import annotations

import argparse
import itertools
import time

from difftest.campaign.run import planned_cases, run_campaign
from difftest.execution.executors import InProcessExecutor
from difftest.execution.warmup import warm_up, warm_up_in_processes
from difftest.interfaces.commands._campaign_options import add_campaign_arguments, campaign_config
from difftest.machine.device import pick_device
from difftest.model.errors import ExitCode
from difftest.paths import resolve
from difftest.records.atomic import write_json

HELP = "measure cases per second per path and the time split (compile apart)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_campaign_arguments(p)
    p.add_argument("--no-warmup", action="store_true", help="do not compile ahead")
    p.add_argument(
        "--warmup-processes",
        type=int,
        default=0,
        help="compile ahead in this many spawned processes (default: one thread per path)",
    )


def main(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    config = campaign_config(args, device, determinism_every=0)
    paths = resolve(args.paths.split(",") if args.paths else None)
    compile_s = draw_ahead_s = 0.0
    source = planned_cases(config, device.type)
    if not args.no_warmup:
        # The cases warmed up for are the campaign's first ones: drawn once, run after.
        clock = time.perf_counter()
        head = list(itertools.islice(source, args.max_cases or 256))
        draw_ahead_s = time.perf_counter() - clock
        planned = [c for _, c in head]
        if args.warmup_processes > 0:
            built = warm_up_in_processes(planned, paths, device, args.warmup_processes, args.plugin)
        else:
            built = warm_up(planned, paths, device)
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
