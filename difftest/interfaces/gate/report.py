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

    def findings(self) -> list[dict[str, Any]]:
        return self.result.findings()

    @property
    def exit_code(self) -> ExitCode:
        if self.findings() or self.corpus.failures:
            return ExitCode.FINDINGS
        if self.setup_error is not None:
            return ExitCode.USAGE
        return ExitCode.OK

    @property
    def verdict(self) -> str:
        count = len(self.findings()) + len(self.corpus.failures)
        if count:
            return f"FAIL: {count} finding(s)"
        return "SETUP ERROR" if self.setup_error else "PASS"


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
        "campaigns": {r.label: r.report.to_json() for r in result.runs},
        "findings": run.findings(),
        "corpus": run.corpus.to_json(),
        "notes": list(run.notes),
        "setup_error": run.setup_error,
        "environment": run.environment.to_json(),
    }


def junit_xml(run: GateRun) -> str:
    suite = ET.Element("testsuite", name="difftest-gate")
    counts = {"tests": 0, "failures": 0, "skipped": 0, "errors": 0}
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in run.findings():
        by_key.setdefault((f["preset"], f["path"]), []).append(f)

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
        if found:
            counts["failures"] += 1
            first = found[0]
            failure = ET.SubElement(
                element,
                "failure",
                type=first["kind"],
                message=f"{name}: {len(found)} finding(s); first: {first['kind']}: "
                f"{first['reason']} (repro {Path(first['repro']).name})",
            )
            failure.text = "\n".join(
                f"{f['path']} {f['kind']}: {f['reason']}\n  repro: {f['repro']}" for f in found
            )
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
        found = sum(n for kind, n in outcomes.items() if kind != "AGREE")
        lines.append(
            f"| `{name}` | {preset_run.label} | {stats.get('run', 0)} | "
            f"{outcomes.get('AGREE', 0)} | {found} | {stats.get('skipped', 0)} |"
        )
    # Shrunk findings first: the minimal repro of each bug is the one to read.
    findings = sorted(run.findings(), key=lambda f: not _shrunk(f))
    if findings:
        lines += ["", f"**Findings** ({len(findings)})", ""]
        for f in findings[:MAX_LISTED]:
            minimal = " (shrunk)" if _shrunk(f) else ""
            lines.append(
                f"- `{f['path']}` {f['kind']} [{f['preset']}]: {_one_line(f['reason'])}; "
                f"repro{minimal} {_link(Path(f['repro']), summary_dir)}"
            )
        if len(findings) > MAX_LISTED:
            lines.append(f"- ... and {len(findings) - MAX_LISTED} more (see the JSON report)")
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
    notes = [*run.notes, *([run.setup_error] if run.setup_error else [])]
    if notes:
        lines += ["", "**Notes**", "", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def _shrunk(finding: dict[str, Any]) -> bool:
    original = finding.get("original_digest")
    return original is not None and original != finding.get("case_digest")


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _link(file: Path, base: Path | None) -> str:
    target = os.path.relpath(file, base) if base is not None else str(file)
    return f"[`{file.name}`]({Path(target).as_posix()})"
