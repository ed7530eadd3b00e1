"""``difftest triage DIR``: regroup the findings of an earlier run against the current corpus.

Reads ``DIR/findings.jsonl`` (every finding) and ``DIR/groups.json`` (the run's groups and
their triggers), sorts every finding again (:mod:`difftest.triage.regroup`) and prints the
groups as a campaign report does: NEW before KNOWN, then how findings moved between groups.
Known bugs' expectations are read for the library versions the run recorded. ``--recheck``
confirms each assignment with one rerun of the finding's path here (isolated, like every
kernel run); without it a finding goes to a group whose trigger features its case has.

Exit codes: 0 only known bugs, as expected (or none); 1 NEW groups, known bugs not expected to
fail on the run's versions, or findings no group explains; 2 bad input (not a run directory,
a malformed log, an unknown corpus) or ``--recheck`` with a finding's path missing here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from difftest.campaign.report import variant_name
from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.interfaces.commands._corpus_options import add_corpus_arguments
from difftest.interfaces.commands._session_options import add_session_arguments, session_settings
from difftest.judgement.signature import Signature
from difftest.machine.environment import Environment
from difftest.model.errors import DifftestError, ExitCode, FormatError
from difftest.records.atomic import write_json
from difftest.records.corpus import installed_version, known_bugs
from difftest.records.repro import PACKED_ENDING, Repro, finding_stem, load_repro
from difftest.records.run_dir import (
    FINDINGS_LOG,
    GROUP_INDEX,
    GROUPS,
    LoggedFinding,
    RunDirectory,
    check_output_file,
)
from difftest.triage.groups import GroupRecord, Member
from difftest.triage.packed_only import (
    PackedOnlyFinding,
    PackedOnlyGroup,
    likely_known,
    packed_only_groups,
)
from difftest.triage.regroup import EarlierGroup, Logged, Regrouped, regroup

HELP = "regroup an earlier run's findings against the current corpus (known bugs)"
FORMAT = "difftest-triage/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, metavar="DIR", help="the --out folder of an earlier run")
    add_corpus_arguments(p, "label groups KNOWN", "treat every group as NEW")
    p.add_argument(
        "--recheck",
        action="store_true",
        help="confirm each assignment with one rerun of the finding's path here",
    )
    p.add_argument("--json", type=Path, default=None, help="write the regrouping as JSON here")
    add_session_arguments(p)


def main(args: argparse.Namespace) -> int:
    root: Path = args.dir
    if not root.is_dir() or not ((root / FINDINGS_LOG).is_file() or (root / GROUP_INDEX).is_file()):
        raise DifftestError(f"{root}: not a run directory (no {FINDINGS_LOG} or {GROUP_INDEX})")
    if args.json is not None:
        check_output_file(args.json, "--json")
    if not args.no_known and not args.corpus.is_dir():
        raise DifftestError(f"--corpus {args.corpus}: not a directory")
    run = RunDirectory(root)
    cases, index = run.index()
    logged_findings = list(run.findings())
    packed = [f for f in logged_findings if f.group == "packed-only"]
    final = {(d, g.path): g.id for g in index for d in g.digests}
    logged = [
        Logged(
            member=Member(case=f.case, result=f.result, other_paths=f.other_paths, index=f.index),
            was=final.get((f.digest, f.result.path), f.group),
        )
        for f in logged_findings
        if f.group != "packed-only"
    ]
    earlier, stamp = _earlier_groups(root, index)
    version_of = _versions_of(stamp)
    known = () if args.no_known else tuple(known_bugs(args.corpus, version_of))
    cases = max(cases, len({f.digest for f in logged_findings}))
    if args.recheck:
        paths = tuple(sorted({item.member.result.path for item in logged}))
        settings = session_settings(args, paths=paths)
        with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as s:
            missing = [p for p in paths if p not in {q.name for q in s.runnable}]
            if missing:
                raise DifftestError(
                    f"--recheck: path(s) {', '.join(missing)} cannot run here "
                    f"({'; '.join(s.unavailable.get(p, 'not registered') for p in missing)})"
                )
            result = regroup(logged, earlier, known, cases=cases, recheck=s.still_fails)
    else:
        result = regroup(logged, earlier, known, cases=cases)
    versions = stamp.describe() if stamp is not None else "the versions installed here"
    packed_groups = packed_only_groups(
        PackedOnlyFinding(
            path=f.result.path,
            kind=f.result.outcome,
            detail=f.result.detail,
            variant=variant_name(f.case),
            index=f.index,
            case_digest=f.digest,
            repro=_packed_repro(root, f),
            requests=f.case.batch.num_requests,
            launch_requests=sum(c.batch.num_requests for c in f.launch),
            likely_known=likely_known(f.case, f.result, f.launch, known),
        )
        for f in packed
    )
    for line in report_lines(root, result, versions, args.recheck, packed_groups):
        print(line)
    if args.json is not None:
        write_json(
            args.json,
            {
                "format": FORMAT,
                "source": str(root),
                "corpus": None if args.no_known else str(args.corpus),
                "versions": stamp.to_json() if stamp is not None else None,
                "rechecked": args.recheck,
                "rechecks": result.rechecks,
                "findings": result.findings,
                "packed_only": len(packed),
                "packed_only_groups": [g.to_json() for g in packed_groups],
                "unsorted": result.unsorted,
                "groups": [g.to_json() for g in result.groups],
                "moved": {k: dict(v) for k, v in result.moved.items()},
            },
        )
    return int(exit_code(result, packed_groups))


def _packed_repro(root: Path, finding: LoggedFinding) -> str | None:
    """The repro file a campaign wrote for packed-only ``finding`` (its whole launch), if it
    is in the run folder (``packed/``, named as the campaign names it)."""
    stem = finding_stem(finding.digest, finding.result.path, finding.result.outcome)
    file = root / "packed" / (stem + PACKED_ENDING)
    return str(file) if file.is_file() else None


def exit_code(result: Regrouped, packed: Sequence[PackedOnlyGroup] = ()) -> ExitCode:
    """1 for a NEW group, a known bug its entry does not expect here, or a packed-only group
    (no corpus entry is matched against a launch); else 0."""
    unexpected = [g for g in result.groups if g.known is None or g.expectation != "still_fails"]
    return ExitCode.FINDINGS if unexpected or packed else ExitCode.OK


def report_lines(
    root: Path,
    result: Regrouped,
    versions: str,
    rechecked: bool,
    packed: Sequence[PackedOnlyGroup] = (),
) -> list[str]:
    how = (
        f"confirmed by {result.rechecks} rerun(s) here"
        if rechecked
        else "by trigger features (no rerun; --recheck confirms)"
    )
    new = sum(1 for g in result.groups if g.established and g.known is None)
    known = sum(1 for g in result.groups if g.known is not None)
    lines = [
        f"triage of {root}: {result.findings} finding(s) into {new} NEW and {known} KNOWN "
        f"group(s), {how}",
        f"known bugs' expectations for: {versions}",
    ]
    for group in result.groups:
        lines += group.lines()
        lines += _moves(group, result)
    if result.unsorted:
        lines.append(
            f"{result.unsorted} finding(s) no group explains: run `difftest shrink {root} "
            "--digest D` on one, or a new campaign, to give them a group"
        )
    if packed:
        n = sum(g.count for g in packed)
        lines.append(
            f"{n} finding(s) shown only by packed launches (wrong in the launch, right alone), in "
            f"{len(packed)} group(s) by path and variant, kept as they were:"
        )
        for g in packed:
            lines += g.lines()
    return lines


def _moves(group: GroupRecord, result: Regrouped) -> list[str]:
    came = result.moved.get(group.id)
    if not came or set(came) == {group.id}:
        return []
    parts = ", ".join(f"{n} from {was}" for was, n in came.most_common())
    return [f"    was: {parts}"]


def _earlier_groups(
    root: Path, index: list[GroupRecord]
) -> tuple[list[EarlierGroup], Environment | None]:
    """The earlier run's established groups with their minimal repros, and the environment
    those repros recorded (the versions the run ran on)."""
    out: list[EarlierGroup] = []
    stamp: Environment | None = None
    for record in index:
        if not record.established:
            continue
        repro = _group_repro(root, record)
        if repro is not None and repro.environment is not None and stamp is None:
            stamp = repro.environment
        result = repro.path_result() if repro is not None else None
        out.append(
            EarlierGroup(
                signature=Signature(
                    path=record.path,
                    kind=record.kind,
                    against=record.against,
                    detail=record.detail,
                ),
                trigger=record.trigger,
                id=record.id,
                minimal=repro.case if repro is not None and record.minimal_size else None,
                minimal_result=result if record.minimal_size else None,
                repro=record.minimal,
                shrinks=record.shrinks,
                shrink_runs=record.shrink_runs,
            )
        )
    return out, stamp


def _group_repro(root: Path, record: GroupRecord) -> Repro | None:
    """The group's repro file: where the run wrote it, else under ``DIR/groups/`` (a run
    directory copied elsewhere). ``None`` when neither reads."""
    if record.minimal is None:
        return None
    for file in (Path(record.minimal), root / GROUPS / Path(record.minimal).name):
        if file.is_file():
            try:
                return load_repro(file)
            except FormatError:
                return None
    return None


def _versions_of(stamp: Environment | None) -> Callable[[str], str | None]:
    if stamp is None:
        return installed_version
    recorded = {"flashinfer": stamp.flashinfer, "torch": stamp.torch}
    return lambda library: recorded[library] if library in recorded else None
