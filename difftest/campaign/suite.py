"""One shard of a campaign over several presets: what a ``pytest -n auto`` shard item and one
machine of a gate's CI matrix run.

For each preset the shard runs one deterministic sub-campaign
(:func:`difftest.campaign.run.run_campaign`) over the cases it owns (:class:`Shard`: blocks of
``cases_per_variant`` consecutive cases, so a compile variant's cases stay on one shard) and
records which cases it ran, by campaign index and content digest, so runs can be compared case
by case (two ``ci`` runs must give the same list; the shards of a run must partition it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from difftest.campaign.profiles import preset_label
from difftest.campaign.run import CampaignConfig, CampaignReport, planned_cases, run_campaign
from difftest.campaign.sharding import Shard
from difftest.execution.executors import Executor, InProcessExecutor
from difftest.judgement.tolerance import Tolerance
from difftest.model.case import Case
from difftest.model.errors import DifftestError
from difftest.paths.registry import KernelPath
from difftest.reduction.driver import Shrinker

Isolation = Literal["process", "none"]
PresetProgress = Callable[[str, CampaignReport, float], None]


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
    plugins: tuple[str, ...] = ()
    determinism_every: int = 16
    tolerance: Tolerance = field(default_factory=Tolerance)

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
            budget_s=math.inf if self.budget_s is None else self.budget_s,
            max_cases=self.planned(),
            preset=preset,
            mode=self.mode,
            out_dir=self.out_dir,
            cases_per_variant=self.cases_per_variant,
            max_variants=self.max_variants,
            determinism_every=self.determinism_every,
            shard=self.shard.as_tuple(),
            plugins=self.plugins,
            tolerance=self.tolerance,
        )


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

    def findings(self) -> list[dict[str, Any]]:
        return [{**f, "preset": self.label} for f in self.report.findings]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardResult:
    plan: ShardPlan
    runs: tuple[PresetRun, ...]

    @property
    def cases(self) -> list[CaseRecord]:
        return [c for run in self.runs for c in run.cases]

    @property
    def case_digest(self) -> str:
        return case_list_digest(self.cases)

    def findings(self) -> list[dict[str, Any]]:
        return [f for run in self.runs for f in run.findings()]

    def failure_lines(self) -> list[str]:
        """One line per finding (path, kind, preset, reason) with its repro file below it."""
        lines = []
        for f in self.findings():
            lines.append(f"{f['path']} {f['kind']} [preset {f['preset']}]: {f['reason']}")
            lines.append(f"    repro: {f['repro']}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.plan.seed,
            "shard": str(self.plan.shard),
            "cases": len(self.cases),
            "case_digest": self.case_digest,
            "findings": self.findings(),
        }


def run_shard(
    plan: ShardPlan,
    executor: Executor,
    *,
    shrinker: Shrinker | None = None,
    progress: PresetProgress | None = None,
) -> ShardResult:
    """Run ``plan``'s sub-campaign for each preset, in order, through ``executor``."""
    runs = []
    for preset in plan.presets:
        config = plan.config(preset)
        everything = planned_cases(dataclasses.replace(config, shard=(0, 1)), executor.device.type)
        drawn: list[tuple[int, Case]] = []
        report = run_campaign(
            config,
            executor,
            shrinker=shrinker,
            progress=_tagged(progress, preset_label(preset)),
            cases_override=_recording(everything, plan.owner, drawn),
        )
        # run_campaign runs the cases it draws in order and draws at most one more before it
        # stops, so the cases it ran are exactly the first ``report.cases`` drawn.
        records = tuple(CaseRecord(preset, i, c.digest()) for i, c in drawn[: report.cases])
        runs.append(PresetRun(preset=preset, report=report, cases=records, planned=plan.planned()))
    return ShardResult(plan=plan, runs=tuple(runs))


def _recording(
    source: Iterator[tuple[int, Case]], owner: Shard, into: list[tuple[int, Case]]
) -> Iterator[tuple[int, Case]]:
    """The cases of ``source`` that ``owner`` owns, each noted in ``into`` as it is drawn."""
    for index, case in source:
        if owner.owns(index):
            into.append((index, case))
            yield index, case


def _tagged(
    progress: PresetProgress | None, label: str
) -> Callable[[CampaignReport, float], None] | None:
    if progress is None:
        return None

    def call(report: CampaignReport, elapsed: float) -> None:
        progress(label, report, elapsed)

    return call


def make_executor(
    paths: Sequence[KernelPath],
    device: torch.device,
    *,
    isolation: Isolation = "process",
    plugins: Sequence[str] = (),
    tolerance: Tolerance | None = None,
) -> Executor:
    """``process``: a watched worker (a crash or a hang becomes a finding); ``none``: this
    process."""
    if isolation == "process":
        from difftest.execution.isolation import IsolatedExecutor

        return IsolatedExecutor(list(paths), device, tolerance, plugins=tuple(plugins))
    return InProcessExecutor(paths, device, tolerance)
