"""``difftest run``: a budgeted differential campaign, reported by group.

Exit codes: 0 no finding, or only known bugs where their corpus entries expect them; 1 a NEW
group (or a known bug its entry does not expect here), or the run was interrupted; 2 bad
input, a setup error, or a run in which no chosen path ran any case (health check
``no_case_ran``).
"""

from __future__ import annotations

import argparse

import torch

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig
from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.interfaces.commands._campaign_options import (
    add_campaign_arguments,
    campaign_config,
    check_outputs,
    prestart_workers,
)
from difftest.interfaces.commands._session_options import path_names, session_settings
from difftest.interfaces.console import ProgressLine, print_report
from difftest.model.errors import DifftestError
from difftest.records.atomic import write_json
from difftest.reduction import ShrinkBudget

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
        "--no-shrink",
        action="store_true",
        help="keep each group's first finding as found, without shrinking it (its trigger "
        "is then unknown and its findings are not told apart)",
    )
    p.add_argument(
        "--shrink-runs",
        type=int,
        default=ShrinkBudget().max_runs,
        help=f"runs one shrink of a group may take (default {ShrinkBudget().max_runs})",
    )
    p.add_argument(
        "--shrink-s",
        type=float,
        default=ShrinkBudget().max_seconds,
        help="seconds one shrink of a group may take, within the budget "
        f"(default {ShrinkBudget().max_seconds:g})",
    )


def run_config(args: argparse.Namespace, device: torch.device) -> CampaignConfig:
    """The campaign ``difftest run`` with these options runs on ``device``."""
    return campaign_config(
        args,
        device,
        max_variants=args.variants,
        shrink=not args.no_shrink,
        shrink_runs=args.shrink_runs,
        shrink_seconds=args.shrink_s,
    )


def main(args: argparse.Namespace) -> int:
    if args.shrink_runs < 1 or not args.shrink_s > 0:
        raise DifftestError("--shrink-runs must be >= 1 and --shrink-s > 0")
    check_outputs(args)  # before the session starts a worker
    settings = session_settings(
        args, paths=path_names(args.paths), prestart=prestart_workers(args), skip_unfitting=True
    )
    with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as session:
        config = run_config(args, session.device)
        progress = ProgressLine()
        report = run_campaign(
            config, session, progress=progress, suppress=tuple(args.suppress_health_check)
        )
        progress.finish()
    print_report(report)
    if args.json is not None:
        write_json(args.json, report.to_json())
    return int(report.exit_code())
