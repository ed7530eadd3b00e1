"""The campaign options ``difftest run`` and ``difftest bench`` share, and the config they make."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from difftest.campaign.run import CampaignConfig
from difftest.generation.presets import get_preset
from difftest.model.errors import DifftestError

GPU_CASES_PER_VARIANT = 32
"""On a GPU each new compile variant is a JIT build: draw this many cases per variant."""
GPU_PACK = 8
"""On a GPU, cases per kernel launch."""


def add_campaign_arguments(p: argparse.ArgumentParser) -> None:
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
        f"alone (default: {GPU_PACK} on a GPU, 1 on a CPU)",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=None,
        help="cases per kernel compile variant "
        f"(default: {GPU_CASES_PER_VARIANT} on a GPU, 1 on a CPU)",
    )


def campaign_config(
    args: argparse.Namespace, device: torch.device, **settings: Any
) -> CampaignConfig:
    """The :class:`CampaignConfig` of the shared options (checked; defaults chosen by the
    device), with ``settings`` for the fields only one command sets."""
    if args.budget_s <= 0:
        raise DifftestError(f"--budget-s {args.budget_s} must be > 0")
    if args.max_cases is not None and args.max_cases < 1:
        raise DifftestError(f"--max-cases {args.max_cases} must be >= 1")
    for flag, value in (("--pack", args.pack), ("--cases-per-variant", args.cases_per_variant)):
        if value is not None and value < 1:
            raise DifftestError(f"{flag} {value} must be >= 1")
    if args.preset is not None:
        get_preset(args.preset)
    gpu = device.type == "cuda"
    return CampaignConfig(
        seed=args.seed,
        budget_s=args.budget_s,
        max_cases=args.max_cases,
        preset=args.preset,
        mode=args.mode,
        out_dir=args.out,
        plugins=tuple(args.plugin),
        cases_per_variant=args.cases_per_variant or (GPU_CASES_PER_VARIANT if gpu else 1),
        pack=args.pack or (GPU_PACK if gpu else 1),
        **settings,
    )
