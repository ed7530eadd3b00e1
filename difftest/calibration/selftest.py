"""The self-test: how well difftest finds, and shrinks, the bugs it exists for.

For each mutant (:mod:`difftest.calibration.mutants`) a budgeted campaign runs the default
generators
(:func:`difftest.campaign.run.planned_cases`: every preset and generic configuration, CPU limits on
a CPU) through the mutant alone against the oracle, until the first finding of the kind the
mutant's bug should produce. That finding is shrunk (:func:`difftest.reduction.shrink`) with what
is left of the mutant's budget, and the shrunk case's :meth:`~difftest.model.case.Case.size` is
compared with the smallest case that shows the bug, which each mutant declares. Mutants that
kill or stall the process run in an isolated worker (:mod:`difftest.execution.isolation`).

A mutant passes when it is detected and shrunk to at most its minimal size. A missing shrinker
or isolated executor is an error for the mutants that need it, never a detection.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from difftest.calibration.mutants import MUTANTS, Mutant
from difftest.campaign.run import CampaignConfig, planned_cases, run_campaign
from difftest.execution.executors import Executor, InProcessExecutor
from difftest.judgement.tolerance import Tolerance
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, PathResult
from difftest.reduction.driver import ShrinkOutcome
from difftest.reduction.report import ShrinkReport

log = logging.getLogger(__name__)

SELFTEST_FORMAT = "difftest-selftest/1"
MUTANTS_PLUGIN = "difftest.calibration.mutants"
"""What an isolated worker imports to know the mutant paths."""

DEFAULT_BUDGET_S = 120.0
"""Per mutant: the campaign until detection plus the shrink of the first detection. Most
mutants need under a second on a 2-core CPU; the hang mutant needed 62 s once (each hang costs
a deadline and a fresh worker), so the budget leaves it room on a slower machine."""

ISOLATED_DEADLINE = {"base_s": 1.0, "cold_s": 0.5, "grace_s": 0.5}
"""Deadline overrides for isolated mutants. A mutant runs a CPU-limits case in well under
0.1 s, so one still running after 1 s (1.5 s the first time per variant in a worker) is hung;
every hang the shrinker meets costs this much plus a fresh worker."""

_REPORT_KEYS = {
    "name": "string",
    "bug_class": "string",
    "detected": "boolean",
    "outcome": "str?",
    "cases_run": "integer",
    "cases_to_detect": "int?",
    "original": "int?",
    "shrunk": "int?",
    "minimal": "integer",
    "shrunk_to_minimal": "boolean",
    "shrink_runs": "int?",
    "seconds": "number",
    "detect_seconds": "num?",
    "shrink_seconds": "num?",
    "other_findings": "object",
    "shrunk_case": "obj?",
    "ok": "boolean",
    "error": "str?",
}


_SUMMARY_KEYS = {
    "mutants": "integer",
    "detected": "integer",
    "detection_rate": "number",
    "median_cases_to_detect": "num?",
    "shrunk_to_minimal": "integer",
    "median_shrink_ratio": "num?",
}


def _type(short: str) -> dict[str, Any]:
    """``"integer"`` -> ``{"type": "integer"}``; ``"int?"`` -> the same or null."""
    if not short.endswith("?"):
        return {"type": short}
    full = {"str?": "string", "int?": "integer", "num?": "number", "obj?": "object"}[short]
    return {"anyOf": [{"type": "null"}, {"type": full}]}


def _object(fields: dict[str, str], **exact: Any) -> dict[str, Any]:
    """An object with exactly ``fields`` (short types), some given a full schema."""
    properties = {k: exact.get(k, _type(t)) for k, t in fields.items()}
    return {
        "type": "object",
        "required": sorted(fields),
        "additionalProperties": False,
        "properties": properties,
    }


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": f"difftest selftest report, format {SELFTEST_FORMAT}",
    **_object(
        {
            "format": "string",
            "ok": "boolean",
            "seed": "integer",
            "budget_s": "number",
            "wall_s": "number",
            "summary": "object",
            "mutants": "array",
        },
        format={"const": SELFTEST_FORMAT},
        summary=_object(_SUMMARY_KEYS),
        mutants={"type": "array", "items": _object(_REPORT_KEYS)},
    ),
}
"""JSON Schema of the ``--json`` file (the subset :mod:`difftest.records.schemas` validates)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MutantReport:
    """What the self-test measured for one mutant (sizes are :meth:`Case.size`)."""

    name: str
    bug_class: str
    minimal: int
    seconds: float
    detected: bool = False
    outcome: str | None = None
    """The outcome that detected it."""
    cases_run: int = 0
    cases_to_detect: int | None = None
    """Campaign cases run up to and including the first detecting one."""
    original: int | None = None
    """Size of the detecting case."""
    shrunk: int | None = None
    shrink_runs: int | None = None
    detect_seconds: float | None = None
    shrink_seconds: float | None = None
    other_findings: dict[str, int] = field(default_factory=dict)
    """Findings of kinds this mutant's bug does not explain, by outcome (not shrunk)."""
    shrunk_case: dict[str, Any] | None = None
    error: str | None = None
    """Why the mutant could not be measured (a missing shrinker or isolated executor)."""

    @property
    def shrunk_to_minimal(self) -> bool:
        return self.shrunk is not None and self.shrunk <= self.minimal

    @property
    def ok(self) -> bool:
        return self.error is None and self.detected and self.shrunk_to_minimal

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(
            seconds=round(self.seconds, 3),
            detect_seconds=_rounded(self.detect_seconds),
            shrink_seconds=_rounded(self.shrink_seconds),
            other_findings=dict(self.other_findings),
            shrunk_to_minimal=self.shrunk_to_minimal,
            ok=self.ok,
        )
        assert set(data) == set(_REPORT_KEYS), "the schema and the report disagree"
        return data


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class SelftestReport:
    results: tuple[MutantReport, ...]
    seed: int
    budget_s: float
    wall_s: float

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def summary(self) -> dict[str, Any]:
        """Detection rate, median cases to detection, and shrink quality."""
        found = [r for r in self.results if r.detected]
        cases = [r.cases_to_detect for r in found if r.cases_to_detect is not None]
        ratios = [r.shrunk / r.minimal for r in found if r.shrunk is not None and r.minimal > 0]
        n = len(self.results)
        return {
            "mutants": n,
            "detected": len(found),
            "detection_rate": round(len(found) / n, 3) if n else 0.0,
            "median_cases_to_detect": statistics.median(cases) if cases else None,
            "shrunk_to_minimal": sum(r.shrunk_to_minimal for r in self.results),
            "median_shrink_ratio": round(statistics.median(ratios), 3) if ratios else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SELFTEST_FORMAT,
            "ok": self.ok,
            "seed": self.seed,
            "budget_s": self.budget_s,
            "wall_s": round(self.wall_s, 3),
            "summary": self.summary(),
            "mutants": [r.to_json() for r in self.results],
        }


ExecutorFactory = Callable[[Mutant, torch.device, Tolerance], Executor]
Shrink = Callable[..., ShrinkOutcome]
"""``shrink(case, finding, executor, *, budget)`` as :func:`difftest.reduction.shrink`."""


class MissingPiece(Exception):
    """A component the self-test needs is not installed; the message names it."""


def default_executor(mutant: Mutant, device: torch.device, tolerance: Tolerance) -> Executor:
    """In this process, or in an isolated worker for mutants that crash or hang."""
    if not mutant.isolated:
        return InProcessExecutor([mutant.path()], device, tolerance)
    try:
        from difftest.execution.isolation import IsolatedExecutor
        from difftest.execution.isolation.deadline import Deadline
    except ImportError as e:
        raise MissingPiece(f"needs difftest.execution.isolation.IsolatedExecutor ({e})") from None
    return IsolatedExecutor(
        [mutant.path()],
        device,
        tolerance,
        plugins=(MUTANTS_PLUGIN,),
        deadline=Deadline(**ISOLATED_DEADLINE),
    )


def default_shrink() -> Shrink:
    try:
        from difftest.reduction import shrink
    except ImportError as e:
        raise MissingPiece(f"needs difftest.reduction.shrink ({e})") from None
    return shrink


def shrink_budget(seconds: float) -> Any:
    """The shrinker's budget for ``seconds`` of wall time (its own run limit kept)."""
    from difftest.reduction import ShrinkBudget

    return ShrinkBudget(max_seconds=max(seconds, 0.0))


class CaseStream:
    """The campaign's planned cases, drawn once and replayed for every mutant (each mutant's
    campaign sees the same cases in the same order, and the generator runs only once)."""

    def __init__(self, seed: int, device_type: str) -> None:
        self._source = planned_cases(CampaignConfig(seed=seed), device_type)
        self._drawn: list[tuple[int, Case]] = []

    def __iter__(self) -> Iterator[tuple[int, Case]]:
        i = 0
        while True:
            if i == len(self._drawn):
                drawn = next(self._source, None)
                if drawn is None:
                    return
                self._drawn.append(drawn)
            yield self._drawn[i]
            i += 1


@dataclass(slots=True)
class _Watch:
    """What one mutant's campaign saw: set by the shrinker hook, read by the case source."""

    mutant: Mutant
    shrink: Shrink
    deadline: float
    yielded: int = 0
    cases_to_detect: int | None = None
    outcome: str | None = None
    original: int | None = None
    shrunk: Case | None = None
    shrink_runs: int | None = None
    detect_seconds: float | None = None
    shrink_seconds: float | None = None
    other: Counter[str] = field(default_factory=Counter)

    def cases(self, source: Iterator[tuple[int, Case]]) -> Iterator[tuple[int, Case]]:
        """The campaign's cases, until the bug is detected."""
        for item in source:
            if self.cases_to_detect is not None:
                return
            self.yielded += 1
            yield item

    def __call__(self, case: Case, finding: PathResult, executor: Executor) -> ShrinkOutcome:
        if finding.outcome not in self.mutant.detected_as or self.cases_to_detect is not None:
            self.other[finding.outcome.value] += 1
            return _not_shrunk(case, finding)
        now = time.monotonic()
        self.cases_to_detect = self.yielded
        self.outcome = finding.outcome.value
        self.original = case.size()
        remaining = self.deadline - now
        outcome = self.shrink(case, finding, executor, budget=shrink_budget(remaining))
        self.shrink_seconds = time.monotonic() - now
        self.shrink_runs = outcome.report.runs
        self.shrunk = outcome.case
        return outcome


def _not_shrunk(case: Case, finding: PathResult) -> ShrinkOutcome:
    """A finding the mutant's bug does not explain, kept as found (the repro's ``shrink``
    block, in the shrinker's format, says why it was not shrunk)."""
    digest, size = case.digest(), case.size()
    report = ShrinkReport(
        reproduced=False,
        message=f"not shrunk: {finding.outcome.value} is not what this mutant's bug produces",
        original_size=size,
        shrunk_size=size,
        original_digest=digest,
        shrunk_digest=digest,
        runs=0,
        seconds=0.0,
    )
    result = CaseResult(case_digest=digest, results=(finding,))
    return ShrinkOutcome(case=case, result=result, report=report)


def measure(
    mutant: Mutant,
    *,
    budget_s: float,
    seed: int,
    out_dir: Path,
    device: torch.device,
    executor_factory: ExecutorFactory = default_executor,
    shrink: Shrink | None = None,
    tolerance: Tolerance | None = None,
    cases: CaseStream | None = None,
    max_cases: int | None = None,
) -> MutantReport:
    """One mutant: a campaign of the default generators until detection (or the budget, or
    ``max_cases``), then the shrink of the detecting case."""
    start = time.monotonic()
    tol = tolerance or Tolerance()
    minimal = mutant.minimal.size()

    try:
        shrinker = shrink or default_shrink()
        executor = executor_factory(mutant, device, tol)
    except MissingPiece as e:
        seconds = time.monotonic() - start
        return MutantReport(
            name=mutant.name,
            bug_class=mutant.bug_class,
            minimal=minimal,
            seconds=seconds,
            error=str(e),
        )
    watch = _Watch(mutant=mutant, shrink=shrinker, deadline=start + budget_s)
    config = CampaignConfig(
        seed=seed,
        budget_s=budget_s,
        max_cases=max_cases,
        out_dir=out_dir / mutant.name,
        plugins=(MUTANTS_PLUGIN,),
        shrink_all_findings=True,  # the shrinker below sees every finding: it stops the run
        tolerance=tol,
    )
    try:
        source = watch.cases(iter(cases or CaseStream(seed, device.type)))
        report = run_campaign(config, executor, shrinker=watch, cases_override=source)
    finally:
        executor.close()
    seconds = time.monotonic() - start
    detected = watch.cases_to_detect is not None
    if detected:
        watch.detect_seconds = seconds - (watch.shrink_seconds or 0.0)
    return MutantReport(
        name=mutant.name,
        bug_class=mutant.bug_class,
        detected=detected,
        outcome=watch.outcome,
        cases_run=report.cases,
        cases_to_detect=watch.cases_to_detect,
        original=watch.original,
        shrunk=watch.shrunk.size() if watch.shrunk is not None else None,
        minimal=minimal,
        shrink_runs=watch.shrink_runs,
        seconds=seconds,
        detect_seconds=watch.detect_seconds,
        shrink_seconds=watch.shrink_seconds,
        other_findings=dict(watch.other),
        shrunk_case=watch.shrunk.to_json() if watch.shrunk is not None else None,
    )


def run_selftest(
    mutants: Sequence[Mutant] = MUTANTS,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    seed: int = 0,
    out_dir: Path | None = None,
    device: torch.device | str = "cpu",
    executor_factory: ExecutorFactory = default_executor,
    shrink: Shrink | None = None,
    max_cases: int | None = None,
    on_result: Callable[[MutantReport], None] | None = None,
) -> SelftestReport:
    """Measure every mutant in turn (``budget_s`` each); ``out_dir`` keeps the repros (by
    default they go to a temporary directory that is removed)."""
    start = time.monotonic()
    dev = torch.device(device)
    results = []
    cases = CaseStream(seed, dev.type)
    with tempfile.TemporaryDirectory(prefix="difftest-selftest-") as tmp:
        where = out_dir if out_dir is not None else Path(tmp)
        for mutant in mutants:
            result = measure(
                mutant,
                budget_s=budget_s,
                seed=seed,
                out_dir=where,
                device=dev,
                executor_factory=executor_factory,
                shrink=shrink,
                cases=cases,
                max_cases=max_cases,
            )
            log.info("%s: %s", mutant.name, result.to_json())
            results.append(result)
            if on_result is not None:
                on_result(result)
    return SelftestReport(
        results=tuple(results), seed=seed, budget_s=budget_s, wall_s=time.monotonic() - start
    )
