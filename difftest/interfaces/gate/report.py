"""What a gate run leaves behind: JUnit XML, a markdown summary for the pull request, JSON.

:class:`GateRun` is the whole outcome of one ``ci/gate`` invocation; the three writers are pure
functions of it. JUnit has one testcase per path and preset on this shard (failures name the
path and the repro files; unavailable paths are skipped with their reason) plus one for the
corpus replay. The markdown lists, per path, the cases run and the findings with a one-line
description and a link to the repro file, then what was skipped and why. The JSON (format
``difftest-gate/1``) carries ``case_digest``, the digest of the ordered case list, and the list
itself, so two runs, or the shards of one run, can be compared case by case.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from difftest.campaign.sharding import Shard
from difftest.campaign.suite import PresetRun, ShardResult
from difftest.machine.environment import Environment
from difftest.model.errors import ExitCode
from difftest.model.outcome import Outcome
from difftest.triage.groups import GroupRecord
from difftest.triage.packed_only import PackedOnlyGroup

GATE_FORMAT = "difftest-gate/1"
MAX_LISTED = 20
"""Findings listed in the markdown summary (all of them are in the JSON and JUnit)."""

CorpusStatus = Literal["ran", "unavailable", "disabled", "error"]


CorpusState = Literal["ok", "unexpected", "not checked"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusSummary:
    """The regression corpus replay: whether it ran and each entry's line."""

    status: CorpusStatus
    reason: str = ""
    entries: tuple[tuple[CorpusState, str], ...] = ()
    """``(state, line)`` per replayed entry: as expected, unexpected, or not checked here (its
    path cannot run on this machine, or no expectation covers these library versions)."""

    def lines(self, state: CorpusState) -> list[str]:
        return [line for s, line in self.entries if s == state]

    @property
    def failures(self) -> list[str]:
        return self.lines("unexpected")

    def headline(self) -> str:
        counts = {s: len(self.lines(s)) for s in ("ok", "unexpected", "not checked")}
        return (
            f"Corpus replay: {len(self.entries)} entries, {counts['ok']} as expected, "
            f"{counts['unexpected']} with an unexpected outcome, {counts['not checked']} not "
            "checked here."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "entries": len(self.entries),
            "unexpected": self.failures,
            "as_expected": self.lines("ok"),
            "not_checked": self.lines("not checked"),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class GateRun:
    """Everything one gate run did."""

    profile: str
    derandomized: bool
    shard: Shard
    device: str
    environment: Environment
    paths: tuple[str, ...]
    unavailable: dict[str, str]
    """Chosen paths that cannot run here, with the reason."""
    result: ShardResult
    corpus: CorpusSummary
    notes: tuple[str, ...] = ()
    """One line each: warmup, isolation, an incomplete case list, ..."""
    setup_error: str | None = None
    """Set when the run was incomplete in a way that makes it a setup error (exit 2)."""
    out_dir: Path = field(default_factory=lambda: Path("difftest-out"))

    @property
    def interrupted(self) -> bool:
        return self.result.interrupted

    def unexpected(self) -> list[tuple[str, GroupRecord]]:
        """The groups that fail the gate: NEW ones, and KNOWN ones their entries do not
        expect on the versions here."""
        return self.result.unexpected()

    def packed_only(self) -> list[tuple[str, PackedOnlyGroup]]:
        """The packed-only groups: cases wrong in their launch and right alone. They fail the
        gate too (no corpus entry is matched against a launch)."""
        return self.result.packed_only()

    @property
    def exit_code(self) -> ExitCode:
        if self.unexpected() or self.packed_only() or self.corpus.failures or self.interrupted:
            return ExitCode.FINDINGS
        if self.setup_error is not None or self.result.health_errors():
            return ExitCode.USAGE
        return ExitCode.OK

    @property
    def verdict(self) -> str:
        groups = self.result.groups()
        cases = len(self.result.cases)
        if self.interrupted:
            return (
                f"INTERRUPTED after {cases} cases ({len(groups)} group(s) so far, "
                f"{len(self.unexpected())} unexpected)"
            )
        packed = len(self.packed_only())
        count = len(self.unexpected()) + packed + len(self.corpus.failures)
        if count:
            n_groups, n_corpus = len(self.unexpected()), len(self.corpus.failures)
            also = f", {packed} packed-only group(s)" if packed else ""
            return f"FAIL: {n_groups} unexpected group(s){also}, {n_corpus} corpus failure(s)"
        if self.setup_error or self.result.health_errors():
            return "SETUP ERROR"
        return "PASS"


def _path_rows(run: GateRun) -> Iterator[tuple[PresetRun, str, dict[str, Any]]]:
    for preset_run in run.result.runs:
        for name in run.paths:
            if name in run.unavailable:
                continue
            stats = preset_run.report.paths.get(name)
            yield preset_run, name, stats.to_json() if stats else {}


def to_json(run: GateRun) -> dict[str, Any]:
    result = run.result
    return {
        "format": GATE_FORMAT,
        "verdict": run.verdict,
        "exit_code": int(run.exit_code),
        "profile": run.profile,
        "derandomized": run.derandomized,
        "seed": result.plan.seed,
        "shard": str(run.shard),
        "presets": [r.label for r in result.runs],
        "mode": result.plan.mode,
        "max_cases": result.plan.max_cases,
        "device": run.device,
        "paths": list(run.paths),
        "unavailable": run.unavailable,
        "cases": len(result.cases),
        "case_digest": result.case_digest,
        "case_list": [c.to_json() for c in result.cases],
        "interrupted": run.interrupted,
        "groups": [{**g.to_json(), "preset": label} for label, g in result.groups()],
        "unexpected": [g.id for _, g in run.unexpected()],
        "packed_only": [{**g.to_json(), "preset": label} for label, g in run.packed_only()],
        "health": result.health_errors(),
        "campaigns": {r.label: r.report.to_json() for r in result.runs},
        "corpus": run.corpus.to_json(),
        "notes": list(run.notes),
        "setup_error": run.setup_error,
        "environment": run.environment.to_json(),
    }


def junit_xml(run: GateRun) -> str:
    suite = ET.Element("testsuite", name="difftest-gate")
    counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    by_key: dict[tuple[str, str], list[GroupRecord]] = {}
    for label, g in run.unexpected():
        by_key.setdefault((label, g.path), []).append(g)
    packed_by_key: dict[tuple[str, str], list[PackedOnlyGroup]] = {}
    for label, pg in run.packed_only():
        packed_by_key.setdefault((label, pg.path), []).append(pg)

    def case(name: str, seconds: float = 0.0) -> ET.Element:
        counts["tests"] += 1
        return ET.SubElement(
            suite,
            "testcase",
            classname="difftest.interfaces.gate.command",
            name=name,
            time=f"{seconds:.3f}",
        )

    for preset_run, name, stats in _path_rows(run):
        element = case(f"{name} [{preset_run.label}] shard {run.shard}", stats.get("seconds", 0))
        found = by_key.get((preset_run.label, name), [])
        packed = packed_by_key.get((preset_run.label, name), [])
        if found:
            counts["failures"] += 1
            first = found[0]
            also = f"; {len(packed)} packed-only group(s)" if packed else ""
            failure = ET.SubElement(
                element,
                "failure",
                type=first.kind.value,
                message=f"{name}: {len(found)} group(s); first: {first.kind.value}, needs "
                f"{first.trigger_words} ({first.count} finding(s); repro {first.minimal}){also}",
            )
            failure.text = "\n".join(
                [
                    *(line for g in found for line in g.lines(preset_run.label)),
                    *(line for g in packed for line in g.lines(preset_run.label)),
                ]
            )
        elif packed:
            counts["failures"] += 1
            first_packed = packed[0]
            failure = ET.SubElement(
                element,
                "failure",
                type=first_packed.kind.value,
                message=f"{name}: {len(packed)} packed-only group(s); first: "
                f"{first_packed.kind.value} on {first_packed.variant} ({first_packed.count} "
                f"finding(s), wrong in a packed launch and right alone; repro "
                f"{first_packed.repro})",
            )
            failure.text = "\n".join(line for g in packed for line in g.lines(preset_run.label))
        elif not stats.get("run"):
            counts["skipped"] += 1
            reasons = stats.get("skip_reasons") or {}
            why = next(iter(reasons), "no case ran")
            ET.SubElement(element, "skipped", message=f"no case supported here: {why}")
    for name, reason in run.unavailable.items():
        element = case(f"{name} shard {run.shard}")
        counts["skipped"] += 1
        ET.SubElement(element, "skipped", message=f"{name} not available: {reason}")
    element = case("corpus replay")
    if run.corpus.failures:
        counts["failures"] += 1
        failure = ET.SubElement(
            element,
            "failure",
            type="CORPUS",
            message=f"{len(run.corpus.failures)} corpus entries with an unexpected outcome",
        )
        failure.text = "\n".join(run.corpus.failures)
    elif run.corpus.status == "error":
        counts["errors"] += 1
        ET.SubElement(element, "error", message=run.corpus.reason)
    elif run.corpus.status != "ran":
        counts["skipped"] += 1
        ET.SubElement(
            element, "skipped", message=f"corpus replay {run.corpus.status}: {run.corpus.reason}"
        )
    if run.interrupted:
        counts["errors"] += 1
        ET.SubElement(
            case("gate run"),
            "error",
            type="INTERRUPTED",
            message=f"interrupted after {len(run.result.cases)} cases: the gate did not finish",
        )
    for line in run.result.health_errors():
        counts["errors"] += 1
        ET.SubElement(case("health"), "error", type="HEALTH", message=line)
    if run.setup_error:
        counts["errors"] += 1
        ET.SubElement(case("gate setup"), "error", message=run.setup_error)
    for key, value in counts.items():
        suite.set(key, str(value))
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def markdown(run: GateRun, summary_dir: Path | None = None) -> str:
    """The pull-request comment. Repro links are relative to ``summary_dir`` when given."""
    result = run.result
    env = run.environment
    versions = ", ".join(
        f"{k} {getattr(env, k)}"
        for k in ("torch", "flashinfer", "cuda", "driver")
        if getattr(env, k)
    )
    gpu = f" ({env.gpu}, sm {env.compute_capability})" if env.gpu else ""
    lines = [
        f"### difftest gate: {run.verdict}",
        "",
        f"Profile `{run.profile}`{' (derandomised)' if run.derandomized else ''}, seed "
        f"{result.plan.seed}, shard {run.shard}, device `{run.device}`{gpu}; {versions}.",
        f"{len(result.cases)} cases over presets {', '.join(r.label for r in result.runs)}; "
        f"case digest `{result.case_digest}`.",
        *([run.corpus.headline()] if run.corpus.status == "ran" else []),
        "",
        "| path | preset | cases run | agree | findings | skipped |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for preset_run, name, stats in _path_rows(run):
        outcomes = stats.get("outcomes", {})
        found = sum(n for kind, n in outcomes.items() if Outcome(kind).is_finding)
        lines.append(
            f"| `{name}` | {preset_run.label} | {stats.get('run', 0)} | "
            f"{outcomes.get('AGREE', 0) + outcomes.get('IGNORES', 0)} | {found} | "
            f"{stats.get('skipped', 0)} |"
        )
    groups = sorted(run.result.groups(), key=lambda lg: (not lg[1].is_new, -lg[1].count))
    if groups:
        new = sum(1 for _, g in groups if g.is_new)
        lines += ["", f"**Groups** ({new} new, {len(groups) - new} known)", ""]
        for label, g in groups[:MAX_LISTED]:
            tag = "NEW" if g.is_new else f"KNOWN `{g.known}`"
            repro = _link(Path(g.minimal), summary_dir) if g.minimal else "(no repro)"
            lines.append(
                f"- {tag} `{g.path}` {g.kind.value} [{label}]: {g.count} finding(s) "
                f"({g.share:.0%}); needs {_one_line(g.trigger_words)}; minimal "
                f"{_one_line(g.minimal_case)}; repro {repro}"
            )
        if len(groups) > MAX_LISTED:
            lines.append(f"- ... and {len(groups) - MAX_LISTED} more (see the JSON report)")
    packed_groups = run.packed_only()
    if packed_groups:
        n = sum(g.count for _, g in packed_groups)
        lines += [
            "",
            f"**Packed-only** ({len(packed_groups)} group(s), {n} finding(s): wrong in a packed "
            "launch, right alone; not shrunk)",
            "",
        ]
        for label, pg in packed_groups[:MAX_LISTED]:
            repro = _link(Path(pg.repro), summary_dir) if pg.repro else "(no repro)"
            lines.append(
                f"- `{pg.path}` {pg.kind.value} [{label}]: {pg.count} finding(s) on "
                f"{_one_line(pg.variant)}; first at case {pg.first_index}; repro {repro}"
                + "".join(
                    f"; likely known `{name}` ({n} of {pg.count}, not rechecked)"
                    for name, n in pg.likely_known
                )
            )
        if len(packed_groups) > MAX_LISTED:
            lines.append(f"- ... and {len(packed_groups) - MAX_LISTED} more (see the JSON report)")
    if run.corpus.failures:
        lines += ["", f"**Corpus replay**: {len(run.corpus.failures)} unexpected", ""]
        lines += [f"- {_one_line(line)}" for line in run.corpus.failures[:MAX_LISTED]]
    skipped = [f"- `{name}`: {reason}" for name, reason in run.unavailable.items()]
    for preset_run, name, stats in _path_rows(run):
        for reason, count in list((stats.get("skip_reasons") or {}).items())[:3]:
            skipped.append(f"- `{name}` [{preset_run.label}]: {count} case(s): {reason}")
    skipped += [f"- corpus {_one_line(line)}" for line in run.corpus.lines("not checked")]
    if run.corpus.status != "ran":
        skipped.append(f"- corpus replay {run.corpus.status}: {run.corpus.reason}")
    if skipped:
        lines += ["", "**Skipped**", "", *skipped]
    ignored = [
        f"- `{name}` [{preset_run.label}] IGNORES `{arg}` in {count} case(s)"
        for preset_run, name, stats in _path_rows(run)
        for arg, count in sorted((stats.get("ignored") or {}).items())
    ]
    if ignored:
        lines += ["", "**Ignored arguments** (no effect: exact attention)", "", *ignored]
    notes = [
        *run.notes,
        *([run.setup_error] if run.setup_error else []),
        *run.result.health_errors(),
    ]
    if notes:
        lines += ["", "**Notes**", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _link(file: Path, base: Path | None) -> str:
    target = os.path.relpath(file, base) if base is not None else str(file)
    return f"[`{file.name}`]({Path(target).as_posix()})"
