"""``difftest warmup``: compile the kernel variants a campaign needs, before it runs."""

from __future__ import annotations

import argparse
import itertools
import time

from difftest.campaign import CampaignConfig, planned_cases
from difftest.device import pick_device
from difftest.errors import DifftestError, ExitCode
from difftest.paths import resolve
from difftest.warmup import distinct_variants, warm_up
from generators.presets import get_preset

HELP = "compile ahead the kernel variants a campaign or preset will use"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="campaign seed whose variants to build")
    p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    p.add_argument("--preset", default=None, help="model preset (default: any configuration)")
    p.add_argument("--mode", choices=["target_verify", "draft_extend_v2"], default=None)
    p.add_argument("--variants", type=int, default=8, help="how many variants (default 8)")
    p.add_argument("--jobs", type=int, default=4, help="parallel builds (default 4)")


def main(args: argparse.Namespace) -> int:
    if args.variants < 1 or args.jobs < 1:
        raise DifftestError("--variants and --jobs must be >= 1")
    if args.preset is not None:
        get_preset(args.preset)
    device = pick_device(args.device)
    paths = resolve(args.paths.split(",") if args.paths else None)
    config = CampaignConfig(seed=args.seed, preset=args.preset, mode=args.mode)
    plan = (case for _, case in planned_cases(config, device.type))
    variants = distinct_variants(itertools.islice(plan, 100_000), args.variants)
    start = time.perf_counter()
    results = warm_up(variants, paths, device, args.jobs)
    for r in results:
        status = f"failed: {r.error}" if r.error else "ok"
        print(f"{r.path:<22} {r.variant:<48} {r.seconds:7.1f}s  {status}")
    failed = [r for r in results if r.error]
    print(
        f"\n{len(results)} builds for {len(variants)} variants in "
        f"{time.perf_counter() - start:.1f}s wall, {len(failed)} failed"
    )
    return ExitCode.OK
