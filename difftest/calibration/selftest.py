"""The self-test: how well difftest finds, separates and shrinks the bugs it exists for.

**Single mutants** (:data:`difftest.calibration.mutants.MUTANTS`). For each, a campaign of the
default generators (CPU limits on a CPU, seed 0) runs the mutant alone against the oracle, with
triage on, until a group of the kind the mutant's bug produces is established: its first
finding shrunk and ablated. The mutant passes when that group is its only one (noise must not
split it) and its minimal case is no larger than the smallest case that shows the bug, which
each mutant declares.

**Pairs** (:data:`difftest.calibration.mutants.PAIRS`): one kernel with two independent bugs.
A pair's campaign runs until two groups are established. It passes when there are exactly two
groups, each with the trigger its own single mutant gets (naming its own bug's features and not
the other's) and each shrunk to its own single mutant's minimal size. Then the campaign runs
again with the first bug registered as known (the corpus's way): the second must still come out
NEW and shrunk, in at most twice the cases its single mutant needed.

The budgets are counts (cases per campaign, runs per shrink), never seconds: load on the
machine changes how long the self-test takes, never its verdict. Seconds are printed as
information. Mutants that kill or stall the process run in an isolated worker.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CPU_HYPOTHESIS_EVERY, CampaignConfig
from difftest.campaign.report import CampaignReport
from difftest.execution.interrupts import Interrupts
from difftest.execution.isolation.deadline import Deadline
from difftest.execution.session import Session, Settings
from difftest.model.outcome import Outcome
from difftest.triage.groups import GroupRecord, KnownBug, Triage

if TYPE_CHECKING:  # importing the mutants registers their paths: only where they are run
    from difftest.calibration.mutants import Mutant, Pair

log = logging.getLogger(__name__)

SELFTEST_FORMAT = "difftest-selftest/2"
MUTANTS_PLUGIN = "difftest.calibration.mutants"
"""What an isolated worker imports to know the mutant paths."""

MAX_CASES = 400
"""Cases a campaign may run before its bug counts as missed."""
SHRINK_RUNS = 250
"""Runs one shrink may take."""
ISOLATED_DEADLINE = Deadline(base_s=2.0, cold_s=1.0, grace_s=0.5)
"""The watchdog for isolated mutants. A mutant runs a CPU-limits case in well under 0.2 s even
on a loaded machine, so one still running after 2 s (3 s the first time per variant in a
worker) is hung; every hang the shrinker meets costs this much plus a fresh worker."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The self-test's budgets: counts only."""

    max_cases: int = MAX_CASES
    shrink_runs: int = SHRINK_RUNS
    cases_per_variant: int = 1
    """Cases per drawn template (``difftest run --cases-per-variant``; 1, a CPU run's default:
    a fresh template for every case)."""
    hypothesis_every: int = CPU_HYPOTHESIS_EVERY
    """One template in this many from Hypothesis, the others seeded (``difftest run
    --hypothesis-every``; a CPU run's default)."""
    pack: int = 1
    """Cases per kernel launch, each case with its partners (``difftest run --pack``; 1, a CPU
    run's default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MutantReport:
    """What the self-test measured for one single mutant (sizes are :meth:`Case.size`)."""

    name: str
    bug_class: str
    minimal: int
    seconds: float
    detected: bool = False
    outcome: str | None = None
    cases_run: int = 0
    cases_to_detect: int | None = None
    """Cases run up to and including the first detecting one."""
    shrunk: int | None = None
    shrink_runs: int | None = None
    trigger: tuple[str, ...] = ()
    groups: int = 0
    """Groups the campaign reported (1 when the bug is found and nothing else)."""
    error: str | None = None

    @property
    def shrunk_to_minimal(self) -> bool:
        return self.shrunk is not None and self.shrunk <= self.minimal

    @property
    def ok(self) -> bool:
        return self.error is None and self.detected and self.shrunk_to_minimal and self.groups == 1

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data.update(
            seconds=round(self.seconds, 3),
            trigger=list(self.trigger),
            shrunk_to_minimal=self.shrunk_to_minimal,
            ok=self.ok,
        )
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class PartReport:
    """One bug of a pair, as the pair's campaign found it."""

    mutant: str
    expected_trigger: tuple[str, ...]
    """The trigger its single mutant's group has."""
    minimal: int
    """Its single mutant's minimal size."""
    found: bool = False
    trigger: tuple[str, ...] = ()
    shrunk: int | None = None
    cases_to_detect: int | None = None

    @property
    def ok(self) -> bool:
        return (
            self.found
            and self.trigger == self.expected_trigger
            and self.shrunk is not None
            and self.shrunk <= self.minimal
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "mutant": self.mutant,
            "expected_trigger": list(self.expected_trigger),
            "minimal": self.minimal,
            "found": self.found,
            "trigger": list(self.trigger),
            "shrunk": self.shrunk,
            "cases_to_detect": self.cases_to_detect,
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PairReport:
    name: str
    parts: tuple[PartReport, PartReport]
    groups: int
    cases_run: int
    seconds: float
    with_known: PartReport | None = None
    """The second bug, in the campaign where the first is known."""
    known_label: bool = False
    """In that campaign, the first bug's group was labelled KNOWN."""
    single_cases: int | None = None
    """Cases the second bug's single mutant needed."""
    error: str | None = None

    @property
    def within_twice(self) -> bool:
        found = self.with_known
        if found is None or found.cases_to_detect is None or self.single_cases is None:
            return False
        return found.cases_to_detect <= 2 * self.single_cases

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.groups == 2
            and all(p.ok for p in self.parts)
            and self.with_known is not None
            and self.with_known.ok
            and self.within_twice
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "parts": [p.to_json() for p in self.parts],
            "groups": self.groups,
            "cases_run": self.cases_run,
            "seconds": round(self.seconds, 3),
            "with_known": self.with_known.to_json() if self.with_known else None,
            "known_label": self.known_label,
            "single_cases": self.single_cases,
            "within_twice": self.within_twice,
            "error": self.error,
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SelftestReport:
    results: tuple[MutantReport, ...]
    pairs: tuple[PairReport, ...]
    seed: int
    budget: Budget
    wall_s: float

    @property
    def ok(self) -> bool:
        measured = bool(self.results or self.pairs)
        return measured and all(r.ok for r in self.results) and all(p.ok for p in self.pairs)

    def summary(self) -> dict[str, Any]:
        """Detection rate, median cases to detection, shrink quality, pairs separated."""
        found = [r for r in self.results if r.detected]
        cases = [r.cases_to_detect for r in found if r.cases_to_detect is not None]
        n = len(self.results)
        return {
            "mutants": n,
            "detected": len(found),
            "detection_rate": round(len(found) / n, 3) if n else 0.0,
            "median_cases_to_detect": statistics.median(cases) if cases else None,
            "shrunk_to_minimal": sum(r.shrunk_to_minimal for r in self.results),
            "one_group": sum(r.groups == 1 for r in self.results),
            "pairs": len(self.pairs),
            "pairs_separated": sum(p.ok for p in self.pairs),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SELFTEST_FORMAT,
            "ok": self.ok,
            "seed": self.seed,
            "budget": {
                "max_cases": self.budget.max_cases,
                "shrink_runs": self.budget.shrink_runs,
                "cases_per_variant": self.budget.cases_per_variant,
                "hypothesis_every": self.budget.hypothesis_every,
                "pack": self.budget.pack,
            },
            "wall_s": round(self.wall_s, 3),
            "summary": self.summary(),
            "mutants": [r.to_json() for r in self.results],
            "pairs": [p.to_json() for p in self.pairs],
        }


def _session(name: str, isolated: bool, device: torch.device) -> Session:
    settings = Settings(
        device=str(device),
        paths=(name,),
        plugins=(MUTANTS_PLUGIN,),
        isolation="process" if isolated else "none",
        deadline=ISOLATED_DEADLINE if isolated else None,
    )
    return Session(settings, interrupts=Interrupts())


def _campaign(
    name: str,
    *,
    isolated: bool,
    budget: Budget,
    seed: int,
    out_dir: Path,
    device: torch.device,
    groups_wanted: int,
    kinds: frozenset[Outcome],
    known: tuple[KnownBug, ...] = (),
) -> CampaignReport:
    """A campaign of ``name`` until ``groups_wanted`` groups of ``kinds`` are established
    with a minimal case (or the case budget ends)."""
    config = CampaignConfig(
        seed=seed,
        max_cases=budget.max_cases,
        out_dir=out_dir,
        shrink_runs=budget.shrink_runs,
        cases_per_variant=budget.cases_per_variant,
        hypothesis_every=budget.hypothesis_every,
        pack=budget.pack,
        shrink_seconds=float("inf"),
        known=known,
    )

    def enough(triage: Triage) -> bool:
        return found_enough(triage, groups_wanted, kinds)

    with _session(name, isolated, device) as session:
        return run_campaign(config, session, stop_when=enough)


def found_enough(triage: Triage, groups_wanted: int, kinds: frozenset[Outcome]) -> bool:
    """Whether a self-test campaign has what it looks for: ``groups_wanted`` new groups of
    ``kinds``, each established and shrunk. A known bug's group does not count (counting it
    stopped the "second bug with the first known" campaign as soon as the known one was
    shrunk, before the second was found)."""
    done = [
        g
        for g in triage.groups
        if g.established
        and g.minimal is not None
        and g.signature.kind in kinds
        and g.members
        and g.known is None
    ]
    return len(done) >= groups_wanted


def _first(report: CampaignReport, kinds: frozenset[Outcome]) -> GroupRecord | None:
    found = [g for g in report.groups if g.kind in kinds and g.established]
    return min(found, key=lambda g: g.cases_to_detection) if found else None


def measure(
    mutant: Mutant, *, budget: Budget, seed: int, out_dir: Path, device: torch.device
) -> MutantReport:
    """One single mutant (see the module docstring)."""
    start = time.monotonic()
    report = _campaign(
        mutant.name,
        isolated=mutant.isolated,
        budget=budget,
        seed=seed,
        out_dir=out_dir / mutant.name,
        device=device,
        groups_wanted=1,
        kinds=mutant.detected_as,
    )
    group = _first(report, mutant.detected_as)
    return MutantReport(
        name=mutant.name,
        bug_class=mutant.bug_class,
        minimal=mutant.minimal.size(),
        seconds=time.monotonic() - start,
        detected=group is not None,
        outcome=group.kind.value if group else None,
        cases_run=report.cases,
        cases_to_detect=group.cases_to_detection if group else None,
        shrunk=group.minimal_size if group else None,
        shrink_runs=group.shrink_runs if group else None,
        trigger=group.trigger if group else (),
        groups=len(report.groups),
    )


def _part(mutant: MutantReport, group: GroupRecord | None) -> PartReport:
    return PartReport(
        mutant=mutant.name,
        expected_trigger=mutant.trigger,
        minimal=mutant.minimal,
        found=group is not None,
        trigger=group.trigger if group else (),
        shrunk=group.minimal_size if group else None,
        cases_to_detect=group.cases_to_detection if group else None,
    )


def measure_pair(
    pair: Pair,
    singles: dict[str, MutantReport],
    *,
    budget: Budget,
    seed: int,
    out_dir: Path,
    device: torch.device,
) -> PairReport:
    """One pair (see the module docstring); ``singles``: its mutants' own reports."""
    start = time.monotonic()
    first, second = (singles[m.name] for m in pair.parts)
    kinds = pair.first.detected_as | pair.second.detected_as
    if not (first.ok and second.ok):
        return PairReport(
            name=pair.name,
            parts=(_part(first, None), _part(second, None)),
            groups=0,
            cases_run=0,
            seconds=0.0,
            error="a single mutant of the pair failed the self-test: its trigger is unknown",
        )
    report = _campaign(
        pair.name,
        isolated=False,
        budget=budget,
        seed=seed,
        out_dir=out_dir / pair.name,
        device=device,
        groups_wanted=2,
        kinds=kinds,
    )
    by_trigger = {g.trigger: g for g in report.groups if g.established}
    parts = (
        _part(first, by_trigger.get(first.trigger)),
        _part(second, by_trigger.get(second.trigger)),
    )
    known = KnownBug(
        name=f"{pair.first.name}-known",
        path=pair.name,
        kind=Outcome(first.outcome or "WRONG"),
        detail=next((g.detail for g in report.groups if g.trigger == first.trigger), "tolerance"),
        trigger=first.trigger,
        expectation="still_fails",
    )
    again = _campaign(
        pair.name,
        isolated=False,
        budget=budget,
        seed=seed,
        out_dir=out_dir / f"{pair.name}-known",
        device=device,
        groups_wanted=1,
        kinds=kinds,
        known=(known,),
    )
    new = [g for g in again.groups if g.is_new and g.established and g.trigger == second.trigger]
    known_label = any(g.known == known.name for g in again.groups) or not any(
        g.trigger == first.trigger for g in again.groups
    )
    return PairReport(
        name=pair.name,
        parts=parts,
        groups=len(report.groups),
        cases_run=report.cases,
        seconds=time.monotonic() - start,
        with_known=_part(second, new[0] if new else None),
        known_label=known_label,
        single_cases=second.cases_to_detect,
    )


def run_selftest(
    mutants: Sequence[Mutant] | None = None,
    pairs: Sequence[Pair] | None = None,
    *,
    budget: Budget | None = None,
    seed: int = 0,
    out_dir: Path | None = None,
    device: torch.device | str = "cpu",
    on_result: Callable[[MutantReport | PairReport], None] | None = None,
) -> SelftestReport:
    """Measure every mutant, then every pair (a pair's mutants are measured first even when
    not asked for: their triggers are what the pair is held to). ``out_dir`` keeps the repros
    (by default they go to a temporary directory that is removed). ``None``: every mutant,
    every pair. (The mutants are imported here, not with this module: importing them registers
    their paths, and the CLI imports this module's budget constants to build its parser.)"""
    from difftest.calibration.mutants import MUTANTS, PAIRS

    mutants = MUTANTS if mutants is None else mutants
    pairs = PAIRS if pairs is None else pairs
    start = time.monotonic()
    dev = torch.device(device)
    budget = budget or Budget()
    results: list[MutantReport] = []
    singles: dict[str, MutantReport] = {}
    done: list[PairReport] = []
    with tempfile.TemporaryDirectory(prefix="difftest-selftest-") as tmp:
        where = out_dir if out_dir is not None else Path(tmp)
        needed = list(dict.fromkeys([*mutants, *(m for p in pairs for m in p.parts)]))
        for mutant in needed:
            result = measure(mutant, budget=budget, seed=seed, out_dir=where, device=dev)
            log.info("%s: %s", mutant.name, result.to_json())
            singles[mutant.name] = result
            if mutant in mutants:
                results.append(result)
                if on_result is not None:
                    on_result(result)
        for pair in pairs:
            pair_report = measure_pair(
                pair, singles, budget=budget, seed=seed, out_dir=where, device=dev
            )
            done.append(pair_report)
            if on_result is not None:
                on_result(pair_report)
    return SelftestReport(
        results=tuple(results),
        pairs=tuple(done),
        seed=seed,
        budget=budget,
        wall_s=time.monotonic() - start,
    )
