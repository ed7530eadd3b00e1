"""``ci/gate`` (``difftest-gate``): the pre-merge gate a kernel or serving repository runs.

It checks the environment (device, library versions, which paths can run here) and says what it
will cover, warms up the kernels' compile variants, runs the deterministic campaign for the
chosen paths and presets on its shard (known bugs' triggers avoided, every finding triaged into
its group) plus the regression corpus replay, and writes JUnit XML, a markdown summary for the
pull request, JSON and the repro files. See ``docs/gate.md``.

Exit codes: 0 pass; 1 a NEW group, a known bug its corpus entry does not expect here, a
packed-only finding (a case wrong in its packed launch and right alone), a corpus entry with an
unexpected outcome, or an interrupted run (the summary says INTERRUPTED and the
JUnit file has an error); 2 setup error (bad arguments, a chosen path that cannot run here, no
GPU where one was asked for, a required corpus that cannot be replayed, a run in which no case
ran); 3 internal error (a bug in difftest, with its traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from difftest.campaign.profiles import PROFILES, Profile, get_profile, preset_label
from difftest.campaign.sharding import Shard
from difftest.execution.interrupts import (
    Interrupts,
    exit_process,
    for_the_process,
    handling_signals,
)
from difftest.interfaces.commands._mode_options import add_mode_arguments, modes_of
from difftest.interfaces.requirements import said_missing
from difftest.model.errors import DifftestError, ExitCode, SetupError
from difftest.records.corpus import DEFAULT_CORPUS

if TYPE_CHECKING:
    from difftest.campaign.suite import ShardPlan
    from difftest.execution.session import Session
    from difftest.interfaces.gate.report import CorpusSummary, GateRun
    from difftest.machine.environment import Environment
    from difftest.paths.registry import KernelPath

WARMUP_CASES = 256
"""Planned cases per preset inspected for compile variants to warm up."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise DifftestError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "difftest-gate",
        description="The difftest pre-merge gate: a deterministic differential campaign over "
        "the chosen kernel paths and presets, plus the regression corpus replay, reported as "
        "JUnit XML, a markdown summary and JSON.",
        epilog="exit codes: 0 pass, 1 findings, 2 setup error, 3 internal error (see docs/gate.md)",
    )
    p.add_argument("--profile", default="ci", help=f"{', '.join(PROFILES)} (default ci)")
    p.add_argument("--paths", default=None, help="comma-separated paths (default: all)")
    p.add_argument(
        "--preset",
        action="append",
        default=None,
        help="model preset, 'any' or 'all'; repeatable or a comma list (default: the profile's)",
    )
    p.add_argument(
        "--mode", choices=["target_verify", "draft_extend_v2"], default=None, help="(default: both)"
    )
    p.add_argument("--seed", type=int, default=None, help="campaign seed (default: the profile's)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall clock per preset (default: the profile's; ci has none)",
    )
    p.add_argument(
        "--max-cases",
        type=int,
        default=None,
        help="cases per preset over all shards (default: the profile's)",
    )
    p.add_argument(
        "--cases-per-variant",
        type=int,
        default=None,
        help="cases per compile variant on a GPU (default: the profile's)",
    )
    p.add_argument("--shard", default="0/1", help="this machine's shard i/N, from 0 (default 0/1)")
    p.add_argument("--junit", type=Path, default=None, help="write JUnit XML here")
    p.add_argument("--summary", type=Path, default=None, help="write the markdown summary here")
    p.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("difftest-gate-out"),
        help="directory for repro files (default difftest-gate-out)",
    )
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="module or .py file registering paths; repeatable",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if present)")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds a path may take on a case before it is a HANG (default 20 CPU, 30 GPU)",
    )
    p.add_argument(
        "--isolation",
        choices=["process", "none"],
        default="process",
        help="process: a crash or hang is a finding (default); none: run in this process",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help="regression corpus directory (default: the one difftest ships)",
    )
    p.add_argument("--no-corpus", action="store_true", help="skip the corpus replay")
    p.add_argument(
        "--require-corpus", action="store_true", help="exit 2 when the corpus cannot be replayed"
    )
    add_mode_arguments(p)
    p.add_argument(
        "--no-shrink",
        action="store_true",
        help="do not shrink groups (by default every group's first finding is shrunk)",
    )
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the gate; returns its exit code. Text goes to ``out`` (default stdout)."""
    stream = sys.stdout if out is None else out
    try:
        args = build_parser().parse_args(argv)
        with handling_signals() as interrupts:
            return int(run_gate(args, stream, interrupts))
    except DifftestError as e:
        sys.stderr.write(f"gate: error: {e}\n")
        return ExitCode.USAGE
    except BrokenPipeError:
        if out is None:
            from difftest.interfaces.cli import discard_stdout

            discard_stdout()
        return ExitCode.PIPE_CLOSED
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except Exception as e:
        if said_missing(e, "gate"):
            return ExitCode.USAGE
        traceback.print_exc()
        sys.stderr.write("gate: internal error (a bug in difftest; please report it)\n")
        return ExitCode.INTERNAL


def console_main() -> None:
    """Entry point for a ``difftest-gate`` console script (and ``ci/gate``): signals are
    handled for the whole process."""
    for_the_process()
    exit_process(main())


def _list(values: Sequence[str | None] | None) -> tuple[str, ...]:
    """Repeated and comma-separated values as one list."""
    return tuple(n.strip() for v in values or () if v for n in v.split(",") if n.strip())


def run_gate(args: argparse.Namespace, out: TextIO, interrupts: Interrupts) -> ExitCode:
    from difftest.execution.session import Session, Settings
    from difftest.records.run_dir import check_output_dir, check_output_file

    profile = get_profile(args.profile)
    shard = Shard.parse(args.shard)
    for name, value in (
        ("--max-cases", args.max_cases),
        ("--cases-per-variant", args.cases_per_variant),
    ):
        if value is not None and value < 1:
            raise DifftestError(f"{name} {value} must be >= 1")
    if args.budget_s is not None and not args.budget_s > 0:
        raise DifftestError(f"--budget-s {args.budget_s} must be > 0")
    check_output_dir(args.out, "--out")
    for flag in ("junit", "summary", "json"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}")
    settings = Settings(
        device=args.device,
        paths=_list([args.paths]) or None,
        plugins=tuple(args.plugin),
        isolation=args.isolation,
        deadline_s=args.deadline_s,
        require_paths=True,
    )
    with Session(settings, interrupts=interrupts) as session:
        return _run(args, out, session, profile, shard)


def _run(
    args: argparse.Namespace, out: TextIO, session: Session, profile: Profile, shard: Shard
) -> ExitCode:
    from difftest.campaign.profiles import expand_presets
    from difftest.campaign.suite import ShardPlan, run_shard
    from difftest.generation.presets import PRESETS
    from difftest.interfaces.gate.report import CorpusSummary, GateRun
    from difftest.machine.environment import stamp
    from difftest.records.corpus import known_bugs

    device = session.device
    paths = session.paths
    presets = expand_presets(_list(args.preset) or profile.presets, tuple(PRESETS))
    unavailable = session.unavailable
    if len(unavailable) == len(paths):
        raise SetupError(f"none of the paths can run on {device}: {unavailable}")
    budget = args.budget_s if args.budget_s is not None else profile.budget_s
    max_cases = args.max_cases if args.max_cases is not None else profile.max_cases
    seed = args.seed if args.seed is not None else profile.resolved_seed()
    plan = ShardPlan(
        seed=seed,
        out_dir=args.out,
        shard=shard,
        presets=presets,
        mode=args.mode,
        max_cases=max_cases,
        budget_s=budget,
        cases_per_variant=args.cases_per_variant or profile.cases_per_variant(device.type),
        determinism_every=profile.determinism_every,
        known=tuple(known_bugs(args.corpus)) if args.corpus.is_dir() else (),
        shrink=not args.no_shrink,
        modes=modes_of(args),
    )
    derandomized = budget is None
    environment = stamp(device)
    runnable = [p for p in paths if p.name not in unavailable]
    _say_coverage(out, profile.name, derandomized, plan, environment, runnable, unavailable)

    notes = []
    if not derandomized:
        notes.append(f"wall-clock budget {budget:g}s per preset: the case list depends on speed")
    notes.append(f"warmup: {_warm_up(plan, session)}")
    out.write(f"{notes[-1]}\n")
    result = run_shard(plan, session, progress=_Progress(out))
    corpus = (
        _corpus(args, profile, session)
        if not session.interrupted
        else CorpusSummary(status="disabled", reason="the gate was interrupted")
    )
    incomplete = [r for r in result.runs if not r.complete]
    for short in incomplete:
        notes.append(
            f"preset {short.label}: {len(short.cases)} of {short.planned} planned cases ran"
        )
    setup_error = None
    if args.require_corpus and corpus.status != "ran":
        setup_error = f"corpus replay required but {corpus.status}: {corpus.reason}"
    run = GateRun(
        profile=profile.name,
        derandomized=derandomized,
        shard=shard,
        device=str(device),
        environment=environment,
        paths=tuple(p.name for p in paths),
        unavailable=unavailable,
        result=result,
        corpus=corpus,
        notes=tuple(n for n in notes if n),
        setup_error=setup_error,
        out_dir=args.out,
    )
    _write_outputs(run, args, out)
    return run.exit_code


def _say_coverage(
    out: TextIO,
    profile: str,
    derandomized: bool,
    plan: ShardPlan,
    env: Environment,
    runnable: Sequence[KernelPath],
    unavailable: dict[str, str],
) -> None:
    cases = "until the budget" if plan.max_cases is None else f"{plan.max_cases} cases"
    share = "" if plan.max_cases is None else f" (this shard: {plan.planned()})"
    out.write(
        f"difftest gate: profile {profile}{' (derandomised)' if derandomized else ''}, "
        f"seed {plan.seed}, shard {plan.shard}\n"
        f"environment: {env.describe()}\n"
        f"covers: {', '.join(p.name for p in runnable)}; presets "
        f"{', '.join(preset_label(p) for p in plan.presets)}; mode {plan.mode or 'any'}; "
        f"{cases} per preset{share}\n"
    )
    for name, reason in unavailable.items():
        out.write(f"not covered: {name}: {reason}\n")


def _warm_up(plan: ShardPlan, session: Session) -> str:
    import itertools

    from difftest.execution.warmup import warm_up
    from difftest.model.case import Case

    start = time.monotonic()
    owner = plan.owner
    wanted = min(plan.planned() or WARMUP_CASES, WARMUP_CASES)
    cases: list[Case] = []
    for preset in plan.presets:
        mine = (c for i, c in plan.cases(preset, session) if owner.owns(i))
        cases += itertools.islice(mine, wanted)
    results = warm_up(cases, session.runnable, session.device)
    failed = [r for r in results if r.error]
    return (
        f"{len(results)} path build(s) for {len(cases)} case(s) in "
        f"{time.monotonic() - start:.1f}s, {len(failed)} failed"
        + (f" (first: {failed[0].path}: {failed[0].error})" if failed else "")
    )


class _Progress:
    def __init__(self, out: TextIO, every_s: float = 10.0) -> None:
        self.out, self.every_s, self.last = out, every_s, time.monotonic()

    def __call__(self, label: str, cases: int, findings: int, groups: int, elapsed: float) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.out.write(
                f"  [{label}] {cases} cases, {findings} finding(s) in {groups} group(s), "
                f"{elapsed:.0f}s\n"
            )
            self.out.flush()


def _corpus(args: argparse.Namespace, profile: Profile, session: Session) -> CorpusSummary:
    from difftest.interfaces.gate.report import CorpusSummary
    from difftest.records.corpus import replay_corpus

    if args.no_corpus:
        return CorpusSummary(status="disabled", reason="--no-corpus")
    if not (profile.corpus_replay or args.require_corpus):
        return CorpusSummary(status="disabled", reason=f"off in profile {profile.name}")
    if not Path(args.corpus).is_dir():
        return CorpusSummary(status="unavailable", reason=f"no corpus directory {args.corpus}")
    try:
        replayed = replay_corpus(Path(args.corpus), session)
    except DifftestError as e:
        return CorpusSummary(status="error", reason=f"corpus replay failed: {e}")
    return CorpusSummary(status="ran", entries=tuple((e.state, e.line()) for e in replayed))


def _write_outputs(run: GateRun, args: argparse.Namespace, out: TextIO) -> None:
    from difftest.interfaces.gate.report import junit_xml, markdown, to_json
    from difftest.records.atomic import write_json, write_text

    if args.junit is not None:
        write_text(args.junit, junit_xml(run))
    if args.json is not None:
        write_json(args.json, to_json(run))
    text = markdown(run, args.summary.parent if args.summary is not None else None)
    if args.summary is not None:
        write_text(args.summary, text)
    out.write("\n" + text)
    written = [str(f) for f in (args.junit, args.summary, args.json) if f is not None]
    out.write(
        f"\nexit {int(run.exit_code)}; wrote {', '.join(written) or 'no report files'}; "
        f"repros under {args.out}\n"
    )
