"""``difftest selftest``: run the mutant kernels and report how well difftest catches them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from difftest.machine.device import pick_device
from difftest.model.errors import DifftestError, ExitCode
from difftest.records.atomic import write_json

HELP = "measure difftest on mutant kernels (detection, cases to it, shrink quality); CPU by default"

_COLUMNS = ("mutant", "detected as", "cases", "shrunk / minimal", "seconds")
_WIDTHS = (32, 16, 6, 18, 7)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget per mutant: campaign plus shrink (default 60)",
    )
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument(
        "--mutants", default=None, help="comma-separated mutant names (default: all of them)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    p.add_argument(
        "--out", type=Path, default=None, help="keep the mutants' repro files here (default: none)"
    )


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, _WIDTHS, strict=True)).rstrip()


def main(args: argparse.Namespace) -> int:
    from difftest.calibration import selftest
    from difftest.calibration.mutants import MUTANTS, get_mutant

    budget = selftest.DEFAULT_BUDGET_S if args.budget_s is None else args.budget_s
    if budget <= 0:
        raise DifftestError(f"--budget-s {budget} must be > 0")
    mutants = [get_mutant(n) for n in args.mutants.split(",")] if args.mutants else MUTANTS
    device = pick_device(args.device or "cpu")

    print(f"difftest selftest: {len(mutants)} mutants, {budget:g} s each, seed {args.seed}")
    print(_row(_COLUMNS))
    print(_row(tuple("-" * w for w in _WIDTHS)))

    def show(r: selftest.MutantReport) -> None:
        if r.error is not None:
            print(f"{r.name}: ERROR, not measured: {r.error}", file=sys.stderr)
        detected = r.outcome if r.detected and r.outcome else "MISSED"
        shrunk = f"{r.shrunk}/{r.minimal}" if r.shrunk is not None else f"-/{r.minimal}"
        if r.detected and not r.shrunk_to_minimal:
            shrunk += " (over)"
        cases = str(r.cases_to_detect) if r.cases_to_detect is not None else f">{r.cases_run}"
        print(_row((r.name, detected, cases, shrunk, f"{r.seconds:.1f}")), flush=True)

    report = selftest.run_selftest(
        mutants, budget_s=budget, seed=args.seed, out_dir=args.out, device=device, on_result=show
    )
    s = report.summary()
    median = s["median_cases_to_detect"]
    ratio = s["median_shrink_ratio"]
    print(
        f"\ndetected {s['detected']}/{s['mutants']} (rate {s['detection_rate']:.2f}), median "
        f"cases to detection {median if median is not None else '-'}, shrunk to minimal size "
        f"{s['shrunk_to_minimal']}/{s['mutants']} (median shrunk/minimal "
        f"{ratio if ratio is not None else '-'}), {report.wall_s:.1f} s"
    )
    if args.json is not None:
        write_json(args.json, report.to_json())
    errors = [r for r in report.results if r.error is not None]
    if errors:
        print(
            f"difftest selftest: {len(errors)} mutant(s) could not be measured "
            f"(missing components); see the ERROR lines",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    return ExitCode.OK if report.ok else ExitCode.FINDINGS
