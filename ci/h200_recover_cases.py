"""Recover findings whose repro files were lost: plan a campaign again and rerun some of its cases.

    python3 ci/h200_recover_cases.py --index N [--around K] [--describe-only] -- RUN OPTIONS
    python3 ci/h200_recover_cases.py --cases FILE -- RUN OPTIONS

RUN OPTIONS are the lost run's ``difftest run`` options (seed, paths, variants, cases per
variant, ...). A campaign's plan is deterministic given its options and the triggers it
avoids; a campaign avoids the known bugs' triggers from its first case and the triggers of
the groups it establishes as it runs. For a run whose only groups before index N were known
ones, the planner with the known triggers gives the same cases up to N. This script plans
them, prints case N (so it can be checked against the lost report's description; the report
counts cases from 1 as they run, the planner from 0), and runs the planned cases N-1-K ..
N-1+K through ``run_campaign`` with shrinking on, into ``--out``: the
groups, their shrunk repros and the findings, as a campaign writes them.

With ``--cases FILE`` it runs the case specs listed in FILE instead (a minimal case written by
hand to test a root cause, say), shrunk and grouped the same way.

On the device machine it runs through ci/device_runner.sh, like difftest itself.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, Planner, known_triggers
from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.interfaces.cli import add_common
from difftest.interfaces.commands import run as run_command
from difftest.interfaces.commands._session_options import path_names, session_settings
from difftest.interfaces.console import print_report
from difftest.model.case import Case
from difftest.records.atomic import write_json


def summary(case: Case) -> dict[str, object]:
    """The facts a lost report printed about a case, to check the plan against."""
    a, b, p = case.attention, case.batch, case.pool
    return {
        "digest": case.digest(),
        "requests": b.num_requests,
        "q_len": b.q_len,
        "prefix_max": max(b.prefix_lens, default=0),
        "heads": f"{a.num_qo_heads}:{a.num_kv_heads}",
        "head_dim": a.head_dim,
        "page_size": a.page_size,
        "page_order": p.page_order,
        "table_fill": p.table_fill,
        "stale_fill": p.stale_fill,
        "kv_storage": p.kv_storage,
        "kv_dtype": a.kv_dtype,
        "q_scale": a.q_scale,
        "compile_variant": repr(case.compile_variant()),
    }


def main(argv: list[str]) -> int:
    mine = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = mine.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--cases",
        type=Path,
        help="instead of replanning: a JSON list of case specs to run (a hand-made minimal "
        "case, say), as the campaign of the options after -- would run them",
    )
    which.add_argument(
        "--index",
        type=int,
        help="the lost finding's case number (findings.jsonl's index, the report's 'first at "
        "case N'): cases counted from 1 in the order they ran",
    )
    mine.add_argument("--around", type=int, default=16, help="cases either side to rerun too")
    mine.add_argument("--describe-only", action="store_true", help="plan and print; run nothing")
    mine.add_argument("--report", type=Path, help="write the rerun's report JSON here")
    if "--" not in argv:
        mine.error("give the lost run's options after --")
    split = argv.index("--")
    ours = mine.parse_args(argv[:split])
    run_parser = argparse.ArgumentParser(prog="difftest run")
    add_common(run_parser)
    run_command.add_arguments(run_parser)
    args = run_parser.parse_args(argv[split + 1 :])
    args.no_shrink = False  # the point is the shrunk repro
    settings = session_settings(args, paths=path_names(args.paths))
    with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as session:
        config = run_command.run_config(args, session.device)
        if ours.cases is not None:
            window = list(enumerate(listed_cases(ours.cases)))
            for _, case in window:
                print(json.dumps(summary(case)), flush=True)
        else:
            window = planned_window(config, session, ours.index, ours.around)
            if window is None:
                print(f"the plan has no case {ours.index}", file=sys.stderr)
                return 2
            if ours.describe_only:
                return 0
        report = run_campaign(config, session, cases=iter(window))
    print_report(report)
    if ours.report is not None:
        write_json(ours.report, report.to_json())
    return int(report.exit_code())


def listed_cases(file: Path) -> list[Case]:
    """The case specs of a JSON list, checked as any case spec is."""
    raw = json.loads(file.read_text())
    return [Case.from_json(c, source=f"{file}[{i}]") for i, c in enumerate(raw)]


def planned_window(
    config: CampaignConfig, session: Session, index: int, around: int
) -> list[tuple[int, Case]] | None:
    """The planned cases around the run's case number ``index`` (printed, with the facts of
    that case), or ``None`` when the plan has no such case."""
    known = known_triggers(config.known, session.runnable)
    planner = Planner(config, session.device, paths=session.runnable, triggers=lambda: known)
    # the run counted case N once it had run it: the planner's index N - 1, give or take
    # the launches compile-ahead deferred while their modules built (the window covers them)
    planned = index - 1
    low, high = max(0, planned - around), planned + around
    window = [
        (i, c) for i, c in itertools.takewhile(lambda x: x[0] <= high, iter(planner)) if i >= low
    ]
    target = next((c for i, c in window if i == planned), None)
    if target is None:
        return None
    facts = {"index": index, "planned_index": planned, **summary(target)}
    print(json.dumps(facts, indent=1))
    print(f"rerunning cases {window[0][0]}..{window[-1][0]} ({len(window)})", flush=True)
    return window


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
