"""The campaign options ``difftest run`` and ``difftest bench`` share, and the config they make."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from difftest.campaign.planning import CPU_HYPOTHESIS_EVERY, CampaignConfig
from difftest.generation.presets import get_preset
from difftest.generation.strategies import GPU_LIMITS, LIMITS, SMALL_LIMITS
from difftest.interfaces.commands._corpus_options import add_corpus_arguments
from difftest.interfaces.commands._mode_options import add_mode_arguments, modes_of
from difftest.interfaces.commands._session_options import add_session_arguments
from difftest.machine.cores import CPU_WORKERS_MAX, cpu_workers
from difftest.machine.device import pick_device
from difftest.model.errors import DifftestError
from difftest.records.corpus import known_bugs
from difftest.records.run_dir import check_output_dir, check_output_file

GPU_CASES_PER_VARIANT = 32
"""On a GPU each new compile variant is a JIT build: draw this many cases per variant."""
GPU_COMPILE_AHEAD = 4
"""On a GPU, processes building the next compile variants' modules while cases run (the H200
machine has 16 cores; each FlashInfer build runs its own compilers)."""


def add_campaign_arguments(p: argparse.ArgumentParser, *, budget: float = 60.0) -> None:
    add_session_arguments(p, budget=budget)
    p.add_argument("--max-cases", type=int, default=None, help="stop after this many cases")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    p.add_argument("--preset", default=None, help="model preset (default: any configuration)")
    p.add_argument("--mode", choices=["target_verify", "draft_extend_v2"], default=None)
    p.add_argument(
        "--limits",
        choices=sorted(LIMITS),
        default=None,
        help="case sizes: cpu, gpu, or small (FlashInfer's test_xqa_batch_decode shape: 4 "
        "requests, L=4, page 64, 4 KV heads, group 2, head dim 128, bf16, prefix <= 110); "
        "default: by the device",
    )
    p.add_argument("--out", type=Path, default=Path("difftest-out"), help="output directory")
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    p.add_argument(
        "--pack",
        type=int,
        default=None,
        help="cases per kernel launch: each case comes with partners that share its launch "
        "arguments, and each path runs them in one launch; a case not AGREE there is rerun "
        f"alone (default: {GPU_LIMITS.gpu_pack} on a GPU, {SMALL_LIMITS.gpu_pack} there with "
        "--limits small; 1 on a CPU)",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=None,
        help="cases per kernel compile variant "
        f"(default: {GPU_CASES_PER_VARIANT} on a GPU, 1 on a CPU)",
    )
    p.add_argument(
        "--hypothesis-every",
        type=int,
        default=None,
        metavar="N",
        help="one template in N is drawn by Hypothesis, the others by the same generator from "
        f"seeded choices (default: 1 on a GPU, {CPU_HYPOTHESIS_EVERY} on a CPU)",
    )
    p.add_argument(
        "--compile-ahead",
        type=int,
        default=None,
        metavar="N",
        help="build the next compile variants' kernel modules in N spawned processes while "
        "the current variant's cases run; the report says how long the run waited on "
        f"compiles (default: {GPU_COMPILE_AHEAD} on a GPU, 0 (off) on a CPU)",
    )
    p.add_argument(
        "--no-fill",
        action="store_true",
        help="with --compile-ahead, wait for a launch's modules instead of running more "
        "runtime variations of the variants already built meanwhile (on by default in a run "
        "bounded by its budget alone; a --max-cases run keeps its case list and waits)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="launches running at once, each in its own isolated worker process (default: "
        f"on a CPU with --isolation process, the usable cores, at most {CPU_WORKERS_MAX}; "
        "else 1)",
    )
    add_corpus_arguments(p, "label groups KNOWN and are avoided", "treat every group as NEW")
    p.add_argument(
        "--no-swarm", action="store_true", help="draw every optional feature independently"
    )
    add_mode_arguments(p)
    p.add_argument(
        "--no-avoid",
        action="store_true",
        help="keep drawing cases that have an established group's trigger",
    )


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse unwritable output paths before anything runs."""
    check_output_dir(args.out, "--out")
    for flag in ("json", "junit", "summary"):
        file = getattr(args, flag, None)
        if file is not None:
            check_output_file(file, f"--{flag}")


def campaign_config(
    args: argparse.Namespace, device: torch.device, **settings: Any
) -> CampaignConfig:
    """The :class:`CampaignConfig` of the shared options (checked; defaults chosen by the
    device), with ``settings`` for the fields only one command sets."""
    if args.max_cases is not None and args.max_cases < 1:
        raise DifftestError(f"--max-cases {args.max_cases} must be >= 1")
    for flag, value in (
        ("--pack", args.pack),
        ("--cases-per-variant", args.cases_per_variant),
        ("--hypothesis-every", args.hypothesis_every),
    ):
        if value is not None and value < 1:
            raise DifftestError(f"{flag} {value} must be >= 1")
    if args.compile_ahead is not None and args.compile_ahead < 0:
        raise DifftestError(f"--compile-ahead {args.compile_ahead} must be >= 0")
    if args.workers is not None and args.workers < 1:
        raise DifftestError(f"--workers {args.workers} must be >= 1")
    if args.workers is not None and args.workers > 1 and args.isolation != "process":
        raise DifftestError(f"--workers {args.workers} needs --isolation process")
    if args.preset is not None:
        get_preset(args.preset)
        if args.limits == "small":
            raise DifftestError("--limits small fixes the shape: it takes no --preset")
    check_outputs(args)
    gpu = device.type == "cuda"
    modes = modes_of(args)
    known = () if args.no_known else tuple(known_bugs(args.corpus))
    if "compile_ahead" not in settings:
        default = GPU_COMPILE_AHEAD if gpu else 0
        settings["compile_ahead"] = default if args.compile_ahead is None else args.compile_ahead
    if "workers" not in settings:
        settings["workers"] = args.workers or default_workers(device, args.isolation)
    if "fill" not in settings:
        # extra variations depend on build times: a run with a case count keeps its list
        settings["fill"] = gpu and args.max_cases is None and not modes.graph and not args.no_fill
    return CampaignConfig(
        seed=args.seed,
        max_cases=args.max_cases,
        preset=args.preset,
        mode=args.mode,
        limits=None if args.limits is None else LIMITS[args.limits],
        out_dir=args.out,
        cases_per_variant=args.cases_per_variant or (GPU_CASES_PER_VARIANT if gpu else 1),
        pack=args.pack or (_gpu_pack(args) if gpu and not modes.graph else 1),
        hypothesis_every=args.hypothesis_every,
        modes=modes,
        known=known,
        swarm=not args.no_swarm,
        avoid=not args.no_avoid,
        **settings,
    )


def prestart_workers(args: argparse.Namespace) -> int:
    """The isolated workers a campaign's session starts as it opens (its launch workers; 0
    in process): :attr:`difftest.execution.session.Settings.prestart`."""
    if args.isolation != "process":
        return 0
    return int(args.workers or default_workers(pick_device(args.device), args.isolation))


def default_workers(device: torch.device, isolation: str) -> int:
    """Launches a campaign runs at once by default: on a CPU with isolated workers one per
    usable core (at most :data:`CPU_WORKERS_MAX`), else one."""
    if device.type != "cpu" or isolation != "process":
        return 1
    return cpu_workers()


def _gpu_pack(args: argparse.Namespace) -> int:
    """The default cases per launch on a GPU: the chosen limits' (the GPU limits' without)."""
    return (GPU_LIMITS if args.limits is None else LIMITS[args.limits]).gpu_pack
