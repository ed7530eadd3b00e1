"""One shard of a campaign over several presets: what a ``pytest -n auto`` shard item and one
machine of a gate's CI matrix run.

For each preset the shard runs one deterministic sub-campaign
(:func:`difftest.campaign.loop.run_campaign`) over the cases it owns (:class:`Shard`: blocks
of ``cases_per_variant`` consecutive cases, so a compile variant's cases stay on one shard),
through the command's :class:`~difftest.execution.session.Session` (each sub-campaign within
its own share of the clock), and records which cases it ran, by campaign index and content
digest, so runs can be compared case by case (two ``ci`` runs must give the same list; the
shards of a run must partition it). Known bugs' triggers are avoided from the first case, the
same way on every shard, so the case list stays a function of the plan alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, Planner, known_triggers
from difftest.campaign.profiles import preset_label
from difftest.campaign.report import CampaignReport
from difftest.campaign.sharding import Shard
from difftest.execution.session import Session
from difftest.generation.modes import NO_MODES, Modes
from difftest.model.case import Case
from difftest.model.errors import DifftestError
from difftest.triage.groups import GroupRecord, KnownBug
from difftest.triage.packed_only import PackedOnlyGroup

PresetProgress = Callable[[str, int, int, int, float], None]
"""``progress(preset, cases, findings, groups, elapsed_s)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPlan:
    """What one shard runs: a sub-campaign per preset, each bounded the same way."""

    seed: int
    out_dir: Path
    shard: Shard = field(default_factory=Shard)
    presets: tuple[str | None, ...] = (None,)
    """``None``: any configuration."""
    mode: str | None = None
    max_cases: int | None = None
    """Cases per preset over *all* shards (this shard runs its share); ``None``: no bound."""
    budget_s: float | None = None
    """Wall-clock bound per sub-campaign; ``None``: none (the case list is then fixed)."""
    cases_per_variant: int = 1
    """Cases per compile variant (see :class:`CampaignConfig`); also the shard block size."""
    max_variants: int | None = None
    determinism_every: int = 16
    known: tuple[KnownBug, ...] = ()
    shrink: bool = True
    shrink_runs: int = 100
    shrink_seconds: float = 60.0
    modes: Modes = NO_MODES
    """The production modes of the drawn cases."""

    def __post_init__(self) -> None:
        if self.max_cases is None and self.budget_s is None:
            raise DifftestError("a shard plan needs max_cases or budget_s to stop")
        if self.max_cases is not None and self.max_cases < 1:
            raise DifftestError(f"max_cases {self.max_cases} must be >= 1")
        if self.budget_s is not None and not self.budget_s > 0:
            raise DifftestError(f"budget_s {self.budget_s} must be > 0")
        if not self.presets:
            raise DifftestError("a shard plan needs at least one preset")
        if self.cases_per_variant < 1:
            raise DifftestError(f"cases_per_variant {self.cases_per_variant} must be >= 1")

    @property
    def owner(self) -> Shard:
        """The shard with its block size: what decides which case indices are this shard's."""
        return self.shard.with_block(self.cases_per_variant)

    def planned(self) -> int | None:
        """This shard's cases per preset (``None`` when only the budget bounds it)."""
        return None if self.max_cases is None else self.owner.case_count(self.max_cases)

    def config(self, preset: str | None) -> CampaignConfig:
        return CampaignConfig(
            seed=self.seed,
            max_cases=self.planned(),
            preset=preset,
            mode=self.mode,
            out_dir=self.out_dir / self.shard.id / preset_label(preset),
            cases_per_variant=self.cases_per_variant,
            max_variants=self.max_variants,
            determinism_every=self.determinism_every,
            known=self.known,
            shrink=self.shrink,
            shrink_runs=self.shrink_runs,
            shrink_seconds=self.shrink_seconds,
            modes=self.modes,
        )

    def cases(self, preset: str | None, session: Session) -> Iterator[tuple[int, Case]]:
        """Every case of ``preset``'s campaign, all shards' (known triggers avoided)."""
        known = known_triggers(self.known, session.runnable)
        planner = Planner(
            self.config(preset), session.device, paths=session.runnable, triggers=lambda: known
        )
        return iter(planner)


@dataclass(frozen=True, slots=True)
class CaseRecord:
    """One case a run did: its preset, campaign index and content digest."""

    preset: str | None
    index: int
    digest: str

    @property
    def key(self) -> str:
        return f"{preset_label(self.preset)}:{self.index}:{self.digest}"

    def to_json(self) -> dict[str, Any]:
        return {"preset": preset_label(self.preset), "index": self.index, "digest": self.digest}


def case_list_digest(records: Sequence[CaseRecord]) -> str:
    """A digest of the ordered case list: equal exactly when two runs did the same cases."""
    text = "\n".join(r.key for r in records)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True, kw_only=True)
class PresetRun:
    preset: str | None
    report: CampaignReport
    cases: tuple[CaseRecord, ...]
    planned: int | None

    @property
    def label(self) -> str:
        return preset_label(self.preset)

    @property
    def complete(self) -> bool:
        """Every planned case ran (a budget-bound run is complete by definition)."""
        return self.planned is None or len(self.cases) == self.planned


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardResult:
    plan: ShardPlan
    runs: tuple[PresetRun, ...]
    interrupted: bool = False

    @property
    def cases(self) -> list[CaseRecord]:
        return [c for run in self.runs for c in run.cases]

    @property
    def case_digest(self) -> str:
        return case_list_digest(self.cases)

    def groups(self) -> list[tuple[str, GroupRecord]]:
        """``(preset label, group)`` for every group of every preset."""
        return [(run.label, g) for run in self.runs for g in run.report.groups]

    def unexpected(self) -> list[tuple[str, GroupRecord]]:
        """NEW groups, and KNOWN ones their entries do not expect here."""
        return [(run.label, g) for run in self.runs for g in run.report.unexpected_groups]

    def packed_only(self) -> list[tuple[str, PackedOnlyGroup]]:
        """``(preset label, group)`` for every packed-only group of every preset (all of them
        unexpected: :mod:`difftest.triage.packed_only`)."""
        return [(run.label, g) for run in self.runs for g in run.report.packed_only_groups]

    def health_errors(self) -> list[str]:
        return [f"[{run.label}] {h.line()}" for run in self.runs for h in run.report.health_errors]

    def failure_lines(self) -> list[str]:
        """The unexpected groups and the packed-only ones, each in a few lines with its
        repro."""
        lines = []
        for label, g in self.unexpected():
            lines += g.lines(label)
        for label, pg in self.packed_only():
            lines += pg.lines(label)
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.plan.seed,
            "shard": str(self.plan.shard),
            "cases": len(self.cases),
            "case_digest": self.case_digest,
            "interrupted": self.interrupted,
            "groups": [{**g.to_json(), "preset": label} for label, g in self.groups()],
            "unexpected": [g.id for _, g in self.unexpected()],
            "findings": sum(len(run.report.findings) for run in self.runs),
        }


def run_shard(
    plan: ShardPlan, session: Session, *, progress: PresetProgress | None = None
) -> ShardResult:
    """Run ``plan``'s sub-campaign for each preset, in order, in ``session``."""
    runs = []
    for preset in plan.presets:
        if session.interrupted:
            break
        config = plan.config(preset)
        drawn: list[tuple[int, Case]] = []
        label = preset_label(preset)
        tagged = None
        if progress is not None:

            def tagged(c: int, f: int, g: int, e: float, label: str = label) -> None:
                progress(label, c, f, g, e)

        with session.phase(plan.budget_s):
            report = run_campaign(
                config,
                session,
                progress=tagged,
                cases=_recording(plan.cases(preset, session), plan.owner, drawn),
            )
        # run_campaign runs the cases it draws in order and draws at most one more before it
        # stops, so the cases it ran are exactly the first ``report.cases`` drawn.
        records = tuple(CaseRecord(preset, i, c.digest()) for i, c in drawn[: report.cases])
        runs.append(PresetRun(preset=preset, report=report, cases=records, planned=plan.planned()))
    return ShardResult(plan=plan, runs=tuple(runs), interrupted=session.interrupted)


def _recording(
    source: Iterator[tuple[int, Case]], owner: Shard, into: list[tuple[int, Case]]
) -> Iterator[tuple[int, Case]]:
    """The cases of ``source`` that ``owner`` owns, each noted in ``into`` as it is drawn."""
    for index, case in source:
        if owner.owns(index):
            into.append((index, case))
            yield index, case
