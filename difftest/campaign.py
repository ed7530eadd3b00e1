"""A budgeted campaign: draw cases, run them, keep every finding as a repro file.

Cases come from the generators in deterministic chunks (the same seed gives the same ordered
list, whose digest the report carries). Each case is written to disk before it runs
(write-ahead), so a crash or a killed process loses nothing; each finding is shrunk (when a
shrinker is given) and written as a repro.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from difftest import counter_rng
from difftest.case import Case
from difftest.compare import Tolerance
from difftest.environment import stamp
from difftest.executor import Executor
from difftest.outcome import CaseResult, Outcome, PathResult
from difftest.repro import Finding, Repro, write_repro
from generators.sampling import sample_cases
from generators.strategies import CPU_LIMITS, GPU_LIMITS, Limits, cases, runtime_variations

log = logging.getLogger(__name__)

CHUNK = 64
"""Cases drawn per generator call; chunk ``k`` uses a seed derived from ``(seed, k)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignConfig:
    seed: int = 0
    budget_s: float = 60.0
    max_cases: int | None = None
    preset: str | None = None
    mode: str | None = None
    out_dir: Path = Path("difftest-out")
    limits: Limits | None = None
    """``None``: chosen by the device (small cases on a CPU)."""
    cases_per_variant: int = 1
    """Cases drawn per compile variant: 1 draws every case afresh (right on a CPU); on a GPU,
    where each new kernel configuration is a JIT compile, a variant's cases differ only in
    what kernels take at run time (see :func:`generators.strategies.runtime_variations`)."""
    max_variants: int | None = None
    """Stop after this many compile variants (bounds JIT compile time on a GPU)."""
    determinism_every: int = 16
    """Rerun every N-th case to check bitwise determinism (0: never)."""
    shard: tuple[int, int] = (0, 1)
    """``(i, n)``: run only cases whose index is ``i`` modulo ``n``."""
    plugins: tuple[str, ...] = ()
    tolerance: Tolerance = field(default_factory=Tolerance)
    shrink_all_findings: bool = False
    """``False``: shrink only the first finding of each (path, kind) and keep the rest as found
    (a broken path fails most cases; shrinking each would take the campaign's time)."""


class Shrinker(Protocol):
    def __call__(self, case: Case, finding: PathResult, executor: Executor) -> ShrinkOutcome: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkOutcome:
    case: Case
    result: CaseResult
    info: dict[str, Any]


def case_seed(seed: int, chunk: int) -> int:
    key = counter_rng.keyed(seed, 12, "cpu")
    return int(counter_rng.hash_coords(key, counter_rng.arange(1, "cpu") + chunk)) & (2**32 - 1)


def planned_cases(config: CampaignConfig, device_type: str) -> Iterator[tuple[int, Case]]:
    """``(index, case)`` in campaign order, this shard's only, without end."""
    limits = config.limits or (GPU_LIMITS if device_type == "cuda" else CPU_LIMITS)
    strategy = cases(preset=config.preset, mode=config.mode, limits=limits)
    index = 0
    shard, shards = config.shard
    per_variant = max(1, config.cases_per_variant)
    for chunk in range(1 << 30):
        drawn = sample_cases(strategy, seed=case_seed(config.seed, chunk), count=CHUNK)
        for n, template in enumerate(drawn):
            if config.max_variants is not None and chunk * CHUNK + n >= config.max_variants:
                return
            group = [template]
            if per_variant > 1:
                seed = case_seed(config.seed ^ 0x5EED, chunk * CHUNK + n)
                more = sample_cases(
                    runtime_variations(template, limits, config.mode), seed=seed, count=per_variant
                )
                group += [c for c in more if c != template][: per_variant - 1]
            for case in group:
                if index % shards == shard:
                    yield index, case
                index += 1


@dataclass(slots=True)
class PathStats:
    run: int = 0
    skipped: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "skipped": self.skipped,
            "outcomes": dict(self.outcomes),
            "skip_reasons": dict(self.skip_reasons),
            "seconds": round(self.seconds, 3),
        }


@dataclass(slots=True)
class CampaignReport:
    config: CampaignConfig
    paths: dict[str, PathStats]
    unavailable: dict[str, str]
    cases: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    timings: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    digest: Any = field(default_factory=hashlib.sha256)
    environment: dict[str, Any] = field(default_factory=dict)
    variants: set[tuple[object, ...]] = field(default_factory=set)
    jit: bool = False
    """Kernels compile on first use (a GPU): time the first case of each variant apart."""

    def add(self, case: Case, result: CaseResult) -> None:
        self.cases += 1
        self.digest.update(case.digest().encode())
        timings = dict(result.timings)
        key = case.compile_variant()
        if key not in self.variants:
            self.variants.add(key)
            if self.jit:  # the first case of a variant pays every kernel path's JIT compile
                timings["compile"] = timings.pop("kernels", 0.0)
        self.timings.update(timings)
        for r in result.results:
            stats = self.paths.setdefault(r.path, PathStats())
            if r.outcome is Outcome.UNSUPPORTED:
                stats.skipped += 1
                stats.skip_reasons[r.reason] += 1
            else:
                stats.run += 1
                stats.outcomes[r.outcome.value] += 1
                stats.seconds += r.seconds

    @property
    def case_digest(self) -> str:
        digest: str = self.digest.hexdigest()[:16]
        return digest

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "case_digest": self.case_digest,
            "seed": self.config.seed,
            "shard": f"{self.config.shard[0]}/{self.config.shard[1]}",
            "preset": self.config.preset,
            "mode": self.config.mode,
            "wall_s": round(self.wall_s, 3),
            "variants": len(self.variants),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "paths": {name: s.to_json() for name, s in self.paths.items()},
            "unavailable": self.unavailable,
            "findings": self.findings,
            "environment": self.environment,
        }


Progress = Callable[[CampaignReport, float], None]


def run_campaign(
    config: CampaignConfig,
    executor: Executor,
    *,
    shrinker: Shrinker | None = None,
    progress: Progress | None = None,
    cases_override: Iterator[tuple[int, Case]] | None = None,
) -> CampaignReport:
    """Run cases until the budget, the case limit or the case list runs out."""
    start = time.monotonic()
    names = [p.name for p in executor.paths]
    unavailable = {}
    for p in executor.paths:
        reason = p.availability(executor.device)
        if reason is not None:
            unavailable[p.name] = reason
    report = CampaignReport(
        config=config,
        jit=executor.device.type == "cuda",
        paths={n: PathStats() for n in names},
        unavailable=unavailable,
        environment=stamp(executor.device),
    )
    running_dir = config.out_dir / "running"
    found_dir = config.out_dir / "findings"
    source = cases_override or planned_cases(config, executor.device.type)
    runnable = len(unavailable) < len(names)
    shrunk_kinds: set[tuple[str, str]] = set()
    for index, case in source:
        elapsed = time.monotonic() - start
        if config.max_cases is not None and report.cases >= config.max_cases:
            break
        if elapsed >= config.budget_s or not runnable:
            break
        pending = write_repro(
            running_dir,
            Repro(case=case, status="running", paths=tuple(names), plugins=config.plugins),
        )
        every = config.determinism_every
        result = executor.evaluate(case, check_determinism=bool(every) and index % every == 0)
        report.add(case, result)
        for finding in result.findings():
            # A broken path fails most cases: shrink its first finding of each kind, keep the
            # rest as found (their repros are still written).
            kind = (finding.path, finding.outcome.value)
            first = kind not in shrunk_kinds
            use = shrinker if first or config.shrink_all_findings else None
            shrunk_kinds.add(kind)
            report.findings.append(
                _keep_finding(config, executor, case, result, finding, use, found_dir)
            )
        pending.unlink(missing_ok=True)
        if progress is not None:
            progress(report, time.monotonic() - start)
    report.wall_s = time.monotonic() - start
    return report


def _keep_finding(
    config: CampaignConfig,
    executor: Executor,
    case: Case,
    result: CaseResult,
    finding: PathResult,
    shrinker: Shrinker | None,
    found_dir: Path,
) -> dict[str, Any]:
    original = case
    shrink_info = None
    if shrinker is not None:
        shrunk = shrinker(case, finding, executor)
        case, result, shrink_info = shrunk.case, shrunk.result, shrunk.info
        finding = result.result_for(finding.path) or finding
    repro = Repro(
        case=case,
        status="finding",
        paths=tuple(p.name for p in executor.paths),
        finding=Finding(path=finding.path, kind=finding.outcome, reason=finding.reason),
        result=result.to_json(),
        tolerance=config.tolerance.to_json(),
        environment=stamp(executor.device),
        shrink=shrink_info,
        plugins=config.plugins,
    )
    file = write_repro(found_dir, repro)
    log.info("finding: %s %s -> %s", finding.path, finding.outcome.value, file)
    return {
        "path": finding.path,
        "kind": finding.outcome.value,
        "reason": finding.reason,
        "repro": str(file),
        "case_digest": case.digest(),
        "original_digest": original.digest(),
    }
