"""``difftest warmup``: compile the kernel variants a campaign needs, before it runs; or, with
``--repro``, the modules the cases of repro files and corpus folders need (before a gate, a
replay of the corpus or a bisect, whose replays would otherwise compile one after another).

Exit codes: 0 the builds ran (a failed build is listed with its error, and the campaign will
meet it as that variant's verdict), 1 interrupted (SIGINT, SIGTERM: builds not started are
dropped, and so are builds whose processes the same signal killed: counted as not done, not
as failed), 2 bad input (an unknown path or preset, a malformed repro file)."""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution.interrupts import handling_signals
from difftest.execution.warmup import (
    WarmupResult,
    builds,
    cases_of_variants,
    warm_up,
    warm_up_in_processes,
)
from difftest.generation.presets import get_preset
from difftest.generation.strategies import LIMITS
from difftest.interfaces.commands._mode_options import add_mode_arguments, modes_of
from difftest.machine.device import pick_device
from difftest.model.case import Case
from difftest.model.errors import DifftestError, ExitCode
from difftest.paths import resolve
from difftest.records.corpus import given_entries
from difftest.records.repro import load_repro
from difftest.records.untrusted import check_fits

HELP = "compile ahead the kernel variants a campaign or preset will use"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="campaign seed whose variants to build")
    p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    p.add_argument(
        "--preset",
        default=None,
        help="model preset, or several comma-separated (default: any configuration)",
    )
    p.add_argument("--mode", choices=["target_verify", "draft_extend_v2"], default=None)
    p.add_argument(
        "--limits",
        choices=sorted(LIMITS),
        default=None,
        help="case sizes, as the run's --limits (default: by the device)",
    )
    add_mode_arguments(p)  # a run with --graph, --ragged or --skip-softmax draws other variants
    p.add_argument(
        "--variants",
        type=int,
        default=8,
        help="build for the first this many compile variants per preset (default 8); each "
        "path builds each module they need once",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=1,
        help="plan as a run with this setting does (its runtime variations may differ in a "
        "compiled property such as the KV layout), and build what the plan's cases need",
    )
    p.add_argument(
        "--horizon",
        type=int,
        default=256,
        help="with --cases-per-variant: look this many planned cases ahead (default 256)",
    )
    p.add_argument(
        "--repro",
        action="append",
        type=Path,
        default=[],
        metavar="FILE|DIR",
        help="build what this repro file's case needs, or every entry's of this corpus folder, "
        "instead of a campaign's variants (repeatable)",
    )
    p.add_argument("--jobs", type=int, default=4, help="parallel builds (default 4)")
    p.add_argument(
        "--processes",
        action="store_true",
        help="build in --jobs spawned processes, one module build each, instead of one "
        "thread per path (a path's modules then build side by side too)",
    )


def main(args: argparse.Namespace) -> int:
    if args.variants < 1 or args.jobs < 1:
        raise DifftestError("--variants and --jobs must be >= 1")
    presets = args.preset.split(",") if args.preset else [None]
    if args.preset and args.limits == "small":
        raise DifftestError("--limits small fixes the shape: it takes no --preset")
    for name in presets:
        if name is not None:
            get_preset(name)
    if args.cases_per_variant < 1 or args.horizon < 1:
        raise DifftestError("--cases-per-variant and --horizon must be >= 1")
    device = pick_device(args.device)
    chosen = resolve(args.paths.split(",") if args.paths else None)
    paths = []
    for path in chosen:
        reason = path.availability(device)
        if reason is None:
            paths.append(path)
        else:
            print(f"{path.name}: nothing to build here: {reason}", flush=True)
    cases = []
    variants = 0
    from difftest.generation.modes import NO_MODES  # hypothesis: only when a run is planned

    modes = modes_of(args)
    if args.repro:
        if args.preset or args.mode or args.limits or modes != NO_MODES:
            raise DifftestError(
                "--repro builds for its cases: leave out --preset, --mode, --limits and the "
                "mode flags"
            )
        cases = _repro_cases(args.repro, device)
        variants = len({c.compile_variant() for c in cases})
        presets = []
    for name in presets:
        config = CampaignConfig(
            seed=args.seed,
            preset=name,
            mode=args.mode,
            limits=None if args.limits is None else LIMITS[args.limits],
            cases_per_variant=args.cases_per_variant,
            modes=modes,
        )
        plan = (case for _, case in planned_cases(config, device, paths=paths))
        horizon = args.horizon if args.cases_per_variant > 1 else 100_000
        mine = cases_of_variants(itertools.islice(plan, horizon), args.variants)
        cases += mine
        variants += len({c.compile_variant() for c in mine})
    start = time.perf_counter()

    def show(r: WarmupResult) -> None:
        status = f"failed: {r.error}" if r.error else "ok"
        print(f"{r.path:<22} {r.variant:<48} {r.seconds:7.1f}s  {status}", flush=True)

    with handling_signals() as interrupts:
        if args.processes:
            results = warm_up_in_processes(
                cases,
                paths,
                device,
                args.jobs,
                args.plugin,
                on_result=show,
                stop=lambda: interrupts.stopping,
            )
        else:
            results = warm_up(cases, paths, device, args.jobs)
            for r in results:
                show(r)
        interrupts.finished = True
    failed = [r for r in results if r.error]
    if not cases:
        print("no cases to build for")
    print(
        f"\n{len(results)} builds for {variants} variants in "
        f"{time.perf_counter() - start:.1f}s wall, {len(failed)} failed"
    )
    if interrupts.stopping:
        dropped = len(builds(cases, paths, device)) - len(results)
        print(f"interrupted ({interrupts.requested}): {dropped} build(s) not done")
        return ExitCode.FINDINGS
    return ExitCode.OK


def _repro_cases(sources: list[Path], device: torch.device) -> list[Case]:
    """The cases of repro files and corpus folders, each checked as untrusted input."""
    files: list[Path] = []
    for source in sources:
        if source.is_dir():
            files += [entry.repro_file for entry in given_entries(source)]
        else:
            files.append(source)
    cases = []
    for file in files:
        repro = load_repro(file)
        check_fits(repro.case, device, str(file))
        cases.append(repro.case)
    return cases
