"""A budgeted campaign: draw cases, run them (several per kernel launch with ``pack``, see
:mod:`difftest.execution.launches`), keep every finding as a repro file.

Cases come from the generators in deterministic chunks (the same seed gives the same ordered
list, whose digest the report carries). Each case is written to disk before it runs
(write-ahead), so a crash or a killed process loses nothing; each finding is shrunk (when a
shrinker is given) and written as a repro.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difftest.execution import packing
from difftest.execution.executors import Executor
from difftest.execution.launches import Judged, add_times, judge_launch
from difftest.generation import rng as counter_rng
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import (
    CPU_LIMITS,
    GPU_LIMITS,
    Limits,
    cases,
    launch_partners,
    runtime_variations,
)
from difftest.judgement.tolerance import Tolerance
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Finding, Outcome, PathResult
from difftest.records.repro import Repro, write_repro
from difftest.reduction.driver import Shrinker

log = logging.getLogger(__name__)

CHUNK = 8
"""Template cases drawn per generator call; chunk ``k`` uses a seed derived from ``(seed, k)``.
The templates (one per compile variant) do not depend on ``cases_per_variant`` or ``pack``, so
``difftest warmup`` plans the same variants a run with other settings meets."""


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
    what kernels take at run time (see
    :func:`difftest.generation.strategies.runtime_variations`)."""
    max_variants: int | None = None
    """Stop after this many compile variants (bounds JIT compile time on a GPU)."""
    pack: int = 1
    """Cases per kernel launch: each drawn case comes with ``pack - 1`` partners that may
    share its launch (:func:`difftest.generation.strategies.launch_partners`), and every path runs
    them in one launch (:mod:`difftest.execution.packing`); a case not AGREE there is rerun
    alone."""
    determinism_every: int = 16
    """Rerun every N-th case to check bitwise determinism (0: never)."""
    shard: tuple[int, int] = (0, 1)
    """``(i, n)``: run only cases whose index is ``i`` modulo ``n``."""
    plugins: tuple[str, ...] = ()
    tolerance: Tolerance = field(default_factory=Tolerance)
    shrink_all_findings: bool = False
    """``False``: shrink only the first finding of each (path, kind) and keep the rest as found
    (a broken path fails most cases; shrinking each would take the campaign's time)."""


def case_seed(seed: int, chunk: int) -> int:
    key = counter_rng.keyed(seed, counter_rng.Stream.CASE_SEED, "cpu")
    return int(counter_rng.hash_coords(key, counter_rng.arange(1, "cpu") + chunk)) & (2**32 - 1)


def planned_cases(config: CampaignConfig, device_type: str) -> Iterator[tuple[int, Case]]:
    """``(index, case)`` in campaign order, this shard's only, without end.

    Each template case starts a compile variant; with ``cases_per_variant > 1`` it is followed
    by runtime variations of it, and with ``pack > 1`` each of those is preceded by partners
    that may share its launch. A case already planned is not planned again. Shards take
    whole launches.
    """
    limits = config.limits or (GPU_LIMITS if device_type == "cuda" else CPU_LIMITS)
    strategy = cases(preset=config.preset, mode=config.mode, limits=limits)
    index = launch_number = 0
    seen: set[str] = set()  # separate generator calls may draw one case twice: run it once
    shard, shards = config.shard
    per_variant = max(1, config.cases_per_variant)
    per_launch = max(1, config.pack)
    for chunk in range(1 << 30):
        seed = case_seed(config.seed, chunk)
        drawn = sample_cases(strategy, seed=seed, count=CHUNK)
        for n, template in enumerate(drawn):
            number = chunk * CHUNK + n
            if config.max_variants is not None and number >= config.max_variants:
                return
            group = [template]
            if per_variant > 1:
                seed = case_seed(config.seed ^ 0x5EED, number)
                more = sample_cases(
                    runtime_variations(template, limits, config.mode), seed=seed, count=per_variant
                )
                group += [c for c in more if c != template][: per_variant - 1]
            for leader in group:
                launch = [leader]
                if per_launch > 1:
                    seed = case_seed(config.seed ^ 0x9AC4, index)
                    partners = launch_partners(leader, limits, config.mode)
                    more = sample_cases(partners, seed=seed, count=per_launch - 1)
                    launch = [*[c for c in more if c != leader][: per_launch - 1], leader]
                launch = [c for c in launch if c.digest() not in seen]
                if not launch:
                    continue
                seen.update(c.digest() for c in launch)
                mine = launch_number % shards == shard
                launch_number += 1
                for case in launch:
                    if mine:
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
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Seconds per activity."""
    wall_s: float = 0.0
    digest: Any = field(default_factory=hashlib.sha256)
    environment: dict[str, Any] = field(default_factory=dict)
    variants: set[tuple[object, ...]] = field(default_factory=set)
    jit: bool = False
    """Kernels compile on first use (a GPU): time the first case of each variant apart."""
    launches: int = 0
    packed_cases: int = 0
    """Cases that shared a launch with others."""
    modes: Counter[str] = field(default_factory=Counter)
    """Cases per mode (target_verify, draft_extend_v2)."""
    interrupted: bool = False
    """Stopped by Ctrl-C or SIGTERM: the report covers the cases finished before it; the
    launch it was running is left as pending repros in ``<out>/running``."""

    def add_launch(self, judged: Sequence[Judged]) -> None:
        """Count one launch's cases. On a GPU the first launch of a compile variant pays
        every kernel path's JIT compile: its kernel time is counted as compile time."""
        cold = False
        for j in judged:
            key = j.case.compile_variant()
            if key not in self.variants:
                self.variants.add(key)
                cold = self.jit
        for j in judged:
            self.cases += 1
            self.modes[j.case.batch.mode] += 1
            self.digest.update(j.case.digest().encode())
            timings = dict(j.timings)
            if cold:
                timings["compile"] = timings.get("compile", 0.0) + timings.pop("kernels", 0.0)
            add_times(self.timings, timings)
            if len(j.launch) > 1:
                self.packed_cases += 1
            for r in j.result.results:
                stats = self.paths.setdefault(r.path, PathStats())
                if r.outcome is Outcome.UNSUPPORTED:
                    stats.skipped += 1
                    stats.skip_reasons[r.reason] += 1
                else:
                    stats.run += 1
                    stats.outcomes[r.outcome.value] += 1
                    stats.seconds += r.seconds
        self.launches += 1

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
            "launches": self.launches,
            "packed_cases": self.packed_cases,
            "modes": dict(self.modes),
            "interrupted": self.interrupted,
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
    source = _timed(cases_override or planned_cases(config, executor.device.type), report)
    launches = packing.group_for_launches(source, max(1, config.pack), case_of=lambda x: x[1])
    try:
        _run_launches(config, executor, report, launches, shrinker, progress, start)
    except KeyboardInterrupt:
        report.interrupted = True
    report.wall_s = time.monotonic() - start
    return report


def _run_launches(
    config: CampaignConfig,
    executor: Executor,
    report: CampaignReport,
    launches: Iterator[list[tuple[int, Case]]],
    shrinker: Shrinker | None,
    progress: Progress | None,
    start: float,
) -> None:
    names = [p.name for p in executor.paths]
    running_dir = config.out_dir / "running"
    found_dir = config.out_dir / "findings"
    shrunk_kinds: set[tuple[str, str]] = set()
    while len(report.unavailable) < len(names):
        if config.max_cases is not None and report.cases >= config.max_cases:
            break
        if time.monotonic() - start >= config.budget_s:
            break
        group = next(launches, None)
        if group is None:
            break
        if config.max_cases is not None:
            group = group[: config.max_cases - report.cases]
        clock = time.perf_counter()
        pending = [
            write_repro(
                running_dir,
                Repro(case=case, status="running", paths=tuple(names), plugins=config.plugins),
            )
            for _, case in group
        ]
        report.timings["record"] += time.perf_counter() - clock
        every = config.determinism_every
        check = bool(every) and any(index % every == 0 for index, _ in group)
        judged = judge_launch(executor, [case for _, case in group], check_determinism=check)
        report.add_launch(judged)
        clock = time.perf_counter()
        shrink_s = 0.0
        for j in judged:
            for finding in j.result.findings():
                # A broken path fails most cases: shrink its first finding of each kind, keep
                # the rest as found (their repros are still written).
                kind = (finding.path, finding.outcome.value)
                first = kind not in shrunk_kinds
                use = shrinker if first or config.shrink_all_findings else None
                shrunk_kinds.add(kind)
                entry, seconds = _keep_finding(
                    config, executor, j.case, j.result, finding, use, found_dir
                )
                report.findings.append(entry)
                shrink_s += seconds
            for finding in j.packed_only:
                report.findings.append(_keep_packed_only(config, executor, j, finding, found_dir))
        # Keeping the findings: shrinking them, and writing their repros.
        report.timings["shrink"] += shrink_s
        report.timings["record"] += time.perf_counter() - clock - shrink_s
        clock = time.perf_counter()
        for file in pending:
            file.unlink(missing_ok=True)
        report.timings["record"] += time.perf_counter() - clock
        if progress is not None:
            progress(report, time.monotonic() - start)


def _timed(
    source: Iterator[tuple[int, Case]], report: CampaignReport
) -> Iterator[tuple[int, Case]]:
    """``source``, with the time spent drawing each case counted as ``draw``."""
    while True:
        clock = time.perf_counter()
        item = next(source, None)
        report.timings["draw"] += time.perf_counter() - clock
        if item is None:
            return
        yield item


def _keep_finding(
    config: CampaignConfig,
    executor: Executor,
    case: Case,
    result: CaseResult,
    finding: PathResult,
    shrinker: Shrinker | None,
    found_dir: Path,
) -> tuple[dict[str, Any], float]:
    """The report entry of a finding, written as a repro (shrunk first when a shrinker is
    given), and the seconds the shrinker took."""
    original = case
    shrink_info = None
    shrink_s = 0.0
    if shrinker is not None:
        clock = time.perf_counter()
        shrunk = shrinker(case, finding, executor)
        shrink_s = time.perf_counter() - clock
        case, result, shrink_info = shrunk.case, shrunk.result, shrunk.info
        finding = result.result_for(finding.path) or finding
    entry = _write_finding(
        config, executor, case, result, finding, found_dir, shrink=shrink_info, original=original
    )
    return entry, shrink_s


def _keep_packed_only(
    config: CampaignConfig, executor: Executor, judged: Judged, finding: PathResult, found_dir: Path
) -> dict[str, Any]:
    """A finding only the packed launch shows: kept with the whole launch, unshrunk (the
    shrinker works on one case)."""
    entry = _write_finding(
        config,
        executor,
        judged.case,
        CaseResult(case_digest=judged.case.digest(), results=(finding,)),
        finding,
        found_dir,
        reason=f"only in a launch of {len(judged.launch)} packed cases: {finding.reason}",
        launch=judged.launch,
    )
    entry["packed_only"] = True
    return entry


def _write_finding(
    config: CampaignConfig,
    executor: Executor,
    case: Case,
    result: CaseResult,
    finding: PathResult,
    found_dir: Path,
    *,
    reason: str | None = None,
    launch: tuple[Case, ...] = (),
    shrink: dict[str, Any] | None = None,
    original: Case | None = None,
) -> dict[str, Any]:
    """Write the repro of ``finding`` on ``case`` (``launch``: the packed launch it needs) and
    return its report entry. A packed-only repro's name ends in ``-packed``."""
    reason = finding.reason if reason is None else reason
    repro = Repro(
        case=case,
        launch=launch,
        status="finding",
        paths=tuple(p.name for p in executor.paths),
        finding=Finding(path=finding.path, kind=finding.outcome, reason=reason),
        result=result.to_json(),
        tolerance=config.tolerance.to_json(),
        environment=stamp(executor.device),
        shrink=shrink,
        plugins=config.plugins,
    )
    name = f"{repro.file_name()[:-5]}-packed.json" if launch else None
    file = write_repro(found_dir, repro, file_name=name)
    log.info("finding: %s %s -> %s", finding.path, finding.outcome.value, file)
    return {
        "path": finding.path,
        "kind": finding.outcome.value,
        "reason": reason,
        "repro": str(file),
        "case_digest": case.digest(),
        "original_digest": (original or case).digest(),
    }
