"""``difftest shrink FILE``: shrink a repro's case while its failure keeps its signature.

Writes the shrunk repro (next to the original unless ``--out``) and prints the original and
shrunk size, the runs spent, and the finding's trigger: the features of the shrunk case it
needs, found by ablation as a campaign finds a group's (:func:`difftest.triage.trigger.ablate`;
the labels are what a corpus entry's ``known.trigger`` declares). As a campaign's shrink does,
it does not slide into a known bug of the corpus (``--corpus``): a candidate that one explains
(its trigger reset, the failure goes) is that bug's, not this one's, and is refused; a repro
that is itself a known bug's is shrunk as that bug (``--no-known``: no guard). A pending repro
(``status: running``) is rerun first and its first failure is shrunk. The path runs isolated
by default: shrinking a ``CRASH`` or ``HANG`` repro costs a fresh worker per crash and a
deadline per hang, never the command. Exit codes: 1 a shrunk finding was written, 0 nothing
fails (or the failure did not reproduce), 2 bad input (a malformed file, a plugin not given
with ``--plugin``), or the failing path cannot run here (no GPU, library missing, a
configuration it does not support).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.interfaces.commands._corpus_options import add_corpus_arguments
from difftest.interfaces.commands._session_options import add_session_arguments, session_settings
from difftest.interfaces.console import ProgressLine
from difftest.judgement.signature import signature_of
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.model.errors import ExitCode, SetupError
from difftest.model.outcome import Finding, PathResult
from difftest.paths.registry import get_path
from difftest.records.corpus import known_bugs
from difftest.records.replay import missing_paths
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.records.run_dir import check_output_dir, finding_by_digest, repro_of
from difftest.records.untrusted import check_fits
from difftest.reduction import ShrinkBudget, shrink
from difftest.reduction.driver import Accept
from difftest.triage.groups import Triage
from difftest.triage.trigger import Trigger, ablate

HELP = "shrink a repro to a minimal case that fails the same way"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file", type=Path, metavar="FILE", help="a repro file, or a run directory with --digest"
    )
    p.add_argument(
        "--digest", default=None, help="with a run directory: the finding of this case (a prefix)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for the shrunk repro")
    p.add_argument(
        "--max-runs",
        type=int,
        default=ShrinkBudget().max_runs,
        help=f"runs of the path the shrink may take (default {ShrinkBudget().max_runs})",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=ShrinkBudget().max_seconds,
        help=f"seconds the shrink may take (default {ShrinkBudget().max_seconds:g})",
    )
    add_corpus_arguments(
        p, "the shrink must not slide into", "shrink without the known bugs' guard"
    )
    add_session_arguments(p)


def main(args: argparse.Namespace) -> int:
    if args.max_runs < 1 or not args.max_seconds > 0:
        raise SetupError("--max-runs must be >= 1 and --max-seconds > 0")
    if args.file.is_dir():
        if args.digest is None:
            raise SetupError(f"{args.file}: a run directory needs --digest D (a finding's case)")
        logged = finding_by_digest(args.file, args.digest)
        repro = repro_of(logged, (logged.result.path, *logged.other_paths))
        source = f"{args.file} --digest {logged.digest}"
        out_dir = args.out or args.file / "shrunk"
    else:
        if args.digest is not None:
            raise SetupError("--digest goes with a run directory, not a repro file")
        repro = load_repro(args.file)
        source = str(args.file)
        out_dir = args.out or args.file.parent
    check_output_dir(out_dir, "--out")
    needed = [repro.finding.path] if repro.finding else list(repro.paths)
    missing_paths(needed, repro, tuple(args.plugin))
    paths = tuple(n for n in dict.fromkeys([*needed, *repro.paths]) if _registered(n))
    settings = session_settings(args, paths=paths)
    with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as session:
        check_fits(repro.case, session.device, source)
        reasons = {n: get_path(n).support(repro.case, session.device) for n in needed}
        if reasons and all(reasons.values()):
            # Shrinking needs the failing path itself: without it every candidate "passes".
            name, reason = next(iter(reasons.items()))
            raise SetupError(f"{source}: path {name} cannot run here: {reason}")
        executor = session.executor()
        recorded = repro.path_result()
        if recorded is None or not recorded.outcome.is_finding:
            first = executor.evaluate(repro.case)
            wanted = repro.finding.path if repro.finding else None
            found = [r for r in first.findings() if wanted in (None, r.path)]
            if not found:
                print(f"{source}: nothing fails on a rerun here; nothing to shrink")
                return ExitCode.OK
            recorded = found[0]
        budget = ShrinkBudget(max_runs=args.max_runs, max_seconds=args.max_seconds)
        accept = _guard(args, repro.case, recorded, session, source)
        print(f"{source}: shrinking {recorded.path} {recorded.outcome.value} ...", flush=True)
        line = ProgressLine()
        outcome = shrink(
            repro.case,
            recorded,
            executor,
            budget=budget,
            accept=accept,
            progress=line.shrinking(repro.case.size()),
        )
        line.finish()
        info = outcome.report
        if not info.reproduced:
            print(f"{source}: {info.message or 'did not reproduce'}")
            return ExitCode.OK
        # Which features the finding needs: each reset alone, most answered by the shrink's
        # cache (the ablation's own budget: one run per feature and half the shrink's seconds).
        trigger = ablate(outcome.case, outcome.prober) if outcome.prober else None
        full = executor.evaluate(outcome.case)
        verdict = full.result_for(recorded.path) or recorded
    shrunk = Repro(
        case=outcome.case,
        status="finding",
        paths=tuple(p.name for p in session.paths),
        finding=Finding(path=verdict.path, kind=verdict.outcome, reason=verdict.reason),
        result=full,
        tolerance=settings.tolerance,
        environment=stamp(session.device),
        shrink=info,
        plugins=repro.plugins,
    )
    file = write_repro(out_dir, shrunk)
    passes = ", ".join(f"{k} x{v}" for k, v in info.passes.items()) or "none"
    print(
        f"{source}: shrunk {verdict.path} {verdict.outcome.value}: size {info.original_size} "
        f"-> {info.shrunk_size} in {info.runs} runs ({info.seconds:.1f}s)"
    )
    print(f"  passes: {passes}")
    if info.exhausted:
        print("  the budget ran out: --max-runs / --max-seconds may shrink it further")
    if info.slips:
        print(f"  {len(info.slips)} other failure(s) seen on the way (kept in the repro)")
    if trigger is not None:
        print(_trigger_line(trigger))
    print(f"  repro: {file}")
    return ExitCode.FINDINGS


def _guard(
    args: argparse.Namespace, case: Case, recorded: PathResult, session: Session, source: str
) -> Accept | None:
    """The shrink's guard against the corpus's known bugs of the finding's signature: a
    candidate one of them explains is refused (``None``: no guard, with ``--no-known``, no
    known bug of that signature, or a repro that is a known bug's itself)."""
    if args.no_known:
        return None
    triage = Triage(known_bugs(args.corpus))
    signature = signature_of(recorded)
    if not any(g.signature == signature for g in triage.groups):
        return None
    own = triage.explaining(case, signature, session.still_fails)
    if own is not None:
        print(f"{source}: known bug {own.name}: shrunk as that bug")
        return None
    return triage.accept_for(signature, session.still_fails)


def _trigger_line(trigger: Trigger) -> str:
    """What the shrunk finding needs, in words and as trigger labels."""
    labels = ", ".join(trigger.key) or "none"
    return f"  needs: {trigger.words()} (trigger: {labels})"


def _registered(name: str) -> bool:
    from difftest.paths.registry import all_paths

    return any(p.name == name for p in all_paths())
