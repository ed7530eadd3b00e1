"""``difftest selftest``: run the mutant kernels and report how well difftest catches them.

Exit codes: 0 every mutant detected, alone in its group and shrunk to its minimal size, and
every pair separated into its two bugs; 1 otherwise; 2 bad arguments. The budgets are counts
(``--max-cases``, ``--shrink-runs``): the verdict never depends on the machine's speed."""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.machine.device import pick_device
from difftest.model.errors import DifftestError, ExitCode
from difftest.records.atomic import write_json
from difftest.records.run_dir import check_output_file

HELP = "measure difftest on mutant kernels (detection, groups, shrink quality); CPU by default"

DEVICE_DEFAULT = "cpu"
"""What ``--device`` is when not given (the mutants are CPU paths; the help says so)."""

_COLUMNS = ("mutant", "detected as", "cases", "shrunk / minimal", "trigger", "seconds")
_WIDTHS = (34, 16, 6, 18, 28, 7)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from difftest.calibration.selftest import MAX_CASES, SHRINK_RUNS
    from difftest.campaign.planning import CPU_HYPOTHESIS_EVERY

    p.add_argument(
        "--max-cases",
        type=int,
        default=MAX_CASES,
        help=f"cases a mutant's campaign may run before its bug counts as missed "
        f"(default {MAX_CASES})",
    )
    p.add_argument(
        "--shrink-runs",
        type=int,
        default=SHRINK_RUNS,
        help=f"runs one shrink may take (default {SHRINK_RUNS})",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=1,
        help="cases per drawn template, as difftest run's option (default 1, a CPU run's)",
    )
    p.add_argument(
        "--hypothesis-every",
        type=int,
        default=CPU_HYPOTHESIS_EVERY,
        metavar="N",
        help="one template in N from Hypothesis, the others seeded, as difftest run's option "
        f"(default {CPU_HYPOTHESIS_EVERY}, a CPU run's)",
    )
    p.add_argument(
        "--pack",
        type=int,
        default=1,
        help="cases per kernel launch (each with its partners), as difftest run's option "
        "(default 1, a CPU run's)",
    )
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument(
        "--mutants",
        default=None,
        help="comma-separated mutant or pair names (default: every mutant and every pair)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    p.add_argument(
        "--out", type=Path, default=None, help="keep the mutants' repro files here (default: none)"
    )


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, _WIDTHS, strict=True)).rstrip()


def main(args: argparse.Namespace) -> int:
    from difftest.calibration import selftest
    from difftest.calibration.mutants import MUTANTS, PAIRS, get_mutant, get_pair

    counts = (
        args.max_cases,
        args.shrink_runs,
        args.cases_per_variant,
        args.hypothesis_every,
        args.pack,
    )
    if min(counts) < 1:
        raise DifftestError(
            "--max-cases, --shrink-runs, --cases-per-variant, --hypothesis-every and --pack "
            "must be >= 1"
        )
    if args.json is not None:
        check_output_file(args.json, "--json")
    mutants, pairs = list(MUTANTS), list(PAIRS)
    if args.mutants:
        names = [n.strip() for n in args.mutants.split(",") if n.strip()]
        mutants = [get_mutant(n) for n in names if not n.startswith("mutant-pair-")]
        pairs = [get_pair(n) for n in names if n.startswith("mutant-pair-")]
    device = pick_device(args.device or "cpu")
    budget = selftest.Budget(
        max_cases=args.max_cases,
        shrink_runs=args.shrink_runs,
        cases_per_variant=args.cases_per_variant,
        hypothesis_every=args.hypothesis_every,
        pack=args.pack,
    )
    print(
        f"difftest selftest: {len(mutants)} mutants and {len(pairs)} pairs, at most "
        f"{budget.max_cases} cases and {budget.shrink_runs} runs per shrink each, "
        f"{budget.cases_per_variant} case(s) per template, one template in "
        f"{budget.hypothesis_every} from Hypothesis, {budget.pack} case(s) per launch, "
        f"seed {args.seed}"
    )
    print(_row(_COLUMNS))
    print(_row(tuple("-" * w for w in _WIDTHS)))

    def show(r: selftest.MutantReport | selftest.PairReport) -> None:
        if isinstance(r, selftest.PairReport):
            _show_pair(r)
            return
        detected = r.outcome if r.detected and r.outcome else "MISSED"
        if r.detected and r.groups != 1:
            detected += f" ({r.groups} groups)"
        shrunk = f"{r.shrunk}/{r.minimal}" if r.shrunk is not None else f"-/{r.minimal}"
        if r.detected and not r.shrunk_to_minimal:
            shrunk += " (over)"
        cases = str(r.cases_to_detect) if r.cases_to_detect is not None else f">{r.cases_run}"
        trigger = " & ".join(r.trigger) or "-"
        print(_row((r.name, detected, cases, shrunk, trigger, f"{r.seconds:.1f}")), flush=True)

    report = selftest.run_selftest(
        mutants,
        pairs,
        budget=budget,
        seed=args.seed,
        out_dir=args.out,
        device=device,
        on_result=show,
    )
    s = report.summary()
    median = s["median_cases_to_detect"]
    print(
        f"\ndetected {s['detected']}/{s['mutants']} (rate {s['detection_rate']:.2f}), median "
        f"cases to detection {median if median is not None else '-'}, alone in one group "
        f"{s['one_group']}/{s['mutants']}, shrunk to minimal size "
        f"{s['shrunk_to_minimal']}/{s['mutants']}; pairs separated "
        f"{s['pairs_separated']}/{s['pairs']}; {report.wall_s:.1f} s (information only)"
    )
    if args.json is not None:
        write_json(args.json, report.to_json())
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _show_pair(r: object) -> None:
    from difftest.calibration.selftest import PairReport

    assert isinstance(r, PairReport)
    status = "ok" if r.ok else "FAILED"
    print(f"{r.name}: {r.groups} group(s) in {r.cases_run} cases, {status}", flush=True)
    for part in r.parts:
        shrunk = f"{part.shrunk}/{part.minimal}" if part.shrunk is not None else "-"
        print(
            f"    {part.mutant}: trigger {' & '.join(part.trigger) or '-'} (expected "
            f"{' & '.join(part.expected_trigger) or '-'}), shrunk {shrunk}, first at case "
            f"{part.cases_to_detect}",
            flush=True,
        )
    if r.with_known is not None:
        k = r.with_known
        print(
            f"    with {r.parts[0].mutant} known: {k.mutant} "
            f"{'NEW' if k.found else 'MISSED'}, shrunk {k.shrunk}/{k.minimal}, first at case "
            f"{k.cases_to_detect} (alone: {r.single_cases}; within 2x: {r.within_twice})",
            flush=True,
        )
    if r.error:
        print(f"    {r.error}", flush=True)
