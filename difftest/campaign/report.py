"""What a campaign did: its groups first, then per-path statistics, time and health.

:class:`Tally` is the campaign's running count; :class:`CampaignReport` is its frozen
snapshot, which the console, the JSON report, the gate and the pytest plugin read. The JSON's
``groups`` list is a stable contract (CI tools read it): each group has at least ``path``,
``kind``, ``trigger`` (feature names, or ``name>threshold`` for sizes), ``count``, ``known``
(the corpus entry's name, or null), ``minimal`` (the shrunk repro's path) and
``minimal_size`` (``Case.size()``).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from difftest.campaign.planning import CampaignConfig, PlanStats
from difftest.execution.health import HealthIssue
from difftest.execution.launches import Judged, add_times
from difftest.machine.environment import Environment
from difftest.model.case import Case
from difftest.model.errors import ExitCode
from difftest.model.outcome import Outcome
from difftest.triage.groups import GroupRecord
from difftest.triage.packed_only import PackedOnlyFinding, PackedOnlyGroup, packed_only_groups

REPORT_FORMAT = "difftest-campaign/2"


@dataclass(frozen=True, slots=True, kw_only=True)
class PathStats:
    """One path's cases: run, skipped (with why), outcomes and the seconds they took."""

    run: int = 0
    skipped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    skip_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    quarantined: str | None = None
    """Why the path was taken out of the run, if it was."""
    ignored: dict[str, int] = field(default_factory=dict)
    """Arguments the cases set that the path does not apply (``IGNORES`` verdicts: its output
    was exact attention), with how many cases set them."""

    @property
    def findings(self) -> int:
        return sum(n for kind, n in self.outcomes.items() if Outcome(kind).is_finding)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "skipped": self.skipped,
            "outcomes": dict(self.outcomes),
            "skip_reasons": dict(self.skip_reasons),
            "seconds": round(self.seconds, 3),
            "quarantined": self.quarantined,
            "ignored": dict(self.ignored),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingRecord:
    """One finding in the report (every finding is also a line of ``findings.jsonl``)."""

    path: str
    kind: Outcome
    detail: str
    reason: str
    case_digest: str
    group: str
    index: int
    packed_only: bool = False
    repro: str | None = None
    """A file of its own: only packed-only findings have one (the others replay by digest
    from ``findings.jsonl``, or through their group's repro)."""
    variant: str = ""
    """The case's compile variant (:func:`variant_name`), for a packed-only finding's group
    (:mod:`difftest.triage.packed_only`)."""
    requests: int = 0
    """A packed-only finding's case's requests (padding included)."""
    launch_requests: int = 0
    """A packed-only finding's launch's requests, all its cases together."""
    likely_known: tuple[str, ...] = ()
    """A packed-only finding's likely known bugs
    (:func:`~difftest.triage.packed_only.likely_known`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "detail": self.detail,
            "reason": self.reason,
            "case_digest": self.case_digest,
            "group": self.group,
            "index": self.index,
            "packed_only": self.packed_only,
            "repro": self.repro,
            "variant": self.variant,
            "requests": self.requests,
            "launch_requests": self.launch_requests,
            "likely_known": list(self.likely_known),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AheadStats:
    """What compiling behind execution did (:mod:`difftest.execution.compile_ahead`); the
    wait for it is the report's ``compile_wait`` timing."""

    processes: int
    builds: int
    """Module builds finished."""
    work_s: float
    """Seconds of build work finished, in all processes together."""
    unfinished: int
    """Builds queued or running when the campaign ended (stopped)."""
    failed: tuple[str, ...] = ()
    """``path variant: error`` of each failed build (its cases ran as without it)."""
    judged_later: dict[str, int] = field(default_factory=dict)
    """Cases per path judged after the other paths had run them: the path's module was
    still building past the campaign's patience (``CampaignConfig.patience_s``)."""
    never_judged: dict[str, int] = field(default_factory=dict)
    """Cases per path the other paths ran but this one never judged: its module was still
    building when the campaign ended."""
    cached: int = 0
    """Modules not built because the library's cache held them (the ledger of
    :mod:`difftest.execution.built_modules`)."""
    filled: int = 0
    """Cases of extra runtime variations of built variants run while a launch's modules
    were building (``CampaignConfig.fill``), in place of waiting."""

    def to_json(self) -> dict[str, Any]:
        return {
            "processes": self.processes,
            "builds": self.builds,
            "cached": self.cached,
            "filled": self.filled,
            "work_s": round(self.work_s, 3),
            "unfinished": self.unfinished,
            "failed": list(self.failed),
            "judged_later": dict(self.judged_later),
            "never_judged": dict(self.never_judged),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignReport:
    config: CampaignConfig
    cases: int
    case_digest: str
    wall_s: float
    groups: tuple[GroupRecord, ...]
    findings: tuple[FindingRecord, ...]
    paths: dict[str, PathStats]
    unavailable: dict[str, str]
    environment: Environment
    timings: dict[str, float]
    variants: int
    launches: int
    packed_cases: int
    modes: dict[str, int]
    interrupted: bool
    stop_reason: str
    health: tuple[HealthIssue, ...] = ()
    plan: PlanStats = field(default_factory=PlanStats)
    died: tuple[str, ...] = ()
    """Digests of cases an earlier run into the same folder left running (kept under
    ``died/``)."""
    compile_s: dict[str, float] = field(default_factory=dict)
    """First-launch seconds per compile variant (on a GPU: its JIT builds)."""
    compile_ahead: AheadStats | None = None
    """``None``: nothing was compiled ahead."""
    out_dir: str = ""

    @property
    def new_groups(self) -> list[GroupRecord]:
        return [g for g in self.groups if g.is_new]

    @property
    def health_errors(self) -> list[HealthIssue]:
        return [h for h in self.health if h.severity == "error"]

    @property
    def unexpected_groups(self) -> list[GroupRecord]:
        """NEW groups, and KNOWN ones their entry does not expect to fail on the versions
        here (a known bug expected fixed that shows again is a regression)."""
        return [g for g in self.groups if g.known is None or g.expectation != "still_fails"]

    @property
    def packed_only_groups(self) -> list[PackedOnlyGroup]:
        """The packed-only findings (wrong in a launch, right alone) in groups: all unexpected,
        no corpus entry being matched against a launch (:mod:`difftest.triage.packed_only`)."""
        return packed_only_groups(
            PackedOnlyFinding(
                path=f.path,
                kind=f.kind,
                detail=f.detail,
                variant=f.variant,
                index=f.index,
                case_digest=f.case_digest,
                repro=f.repro,
                requests=f.requests,
                launch_requests=f.launch_requests,
                likely_known=f.likely_known,
            )
            for f in self.findings
            if f.packed_only
        )

    def exit_code(self) -> ExitCode:
        """2 when a health check failed (nothing was tested); 1 for unexpected groups,
        packed-only findings or an interrupted run; else 0 (only known bugs, as expected, or
        none)."""
        if self.health_errors:
            return ExitCode.USAGE
        if self.unexpected_groups or self.packed_only_groups or self.interrupted:
            return ExitCode.FINDINGS
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "format": REPORT_FORMAT,
            "cases": self.cases,
            "case_digest": self.case_digest,
            "seed": self.config.seed,
            "preset": self.config.preset,
            "mode": self.config.mode,
            "wall_s": round(self.wall_s, 3),
            "interrupted": self.interrupted,
            "stop_reason": self.stop_reason,
            "groups": [g.to_json() for g in self.groups],
            "packed_only_groups": [g.to_json() for g in self.packed_only_groups],
            "health": [h.to_json() for h in self.health],
            "variants": self.variants,
            "launches": self.launches,
            "packed_cases": self.packed_cases,
            "modes": dict(self.modes),
            "production_modes": {
                "graph": self.config.modes.graph,
                "ragged": self.config.modes.ragged,
                "skip_softmax": self.config.modes.skip_softmax,
            },
            "max_variants": self.config.max_variants,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "compile_s": {k: round(v, 3) for k, v in self.compile_s.items()},
            "compile_ahead": self.compile_ahead.to_json() if self.compile_ahead else None,
            "paths": {name: s.to_json() for name, s in self.paths.items()},
            "unavailable": self.unavailable,
            "avoidance": [
                {"trigger": list(t), "avoided": n, "kept": plan.kept.get(t, 0)}
                for t, n in plan.avoided.items()
            ],
            "swarm_held": dict(plan.swarm_held),
            "unsupported_redrawn": plan.unsupported_redrawn,
            "died": list(self.died),
            "out_dir": self.out_dir,
            "environment": self.environment.to_json(),
            "findings": [f.to_json() for f in self.findings],
        }


def variant_name(case: Case) -> str:
    a, b = case.attention, case.batch
    extras = [n for n, on in (("window", a.window_left >= 0), ("sinks", a.sinks)) if on]
    return (
        f"{a.q_dtype}/{a.kv_dtype} H{a.num_qo_heads}:{a.num_kv_heads} D{a.head_dim} "
        f"page{a.page_size} L{b.q_len} {b.draft.kind} {case.pool.kv_storage}"
        + (" " + " ".join(extras) if extras else "")
    )


@dataclass(slots=True)
class _PathTally:
    run: int = 0
    skipped: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    ignored: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Tally:
    """The campaign's running count."""

    config: CampaignConfig
    jit: bool
    """Kernels compile on first use (a GPU): time the first launch of each variant apart."""
    cases: int = 0
    paths: dict[str, _PathTally] = field(default_factory=dict)
    findings: list[FindingRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    digest: Any = field(default_factory=hashlib.sha256)
    variants: set[tuple[object, ...]] = field(default_factory=set)
    compile_s: dict[str, float] = field(default_factory=dict)
    launches: int = 0
    packed_cases: int = 0
    modes: Counter[str] = field(default_factory=Counter)

    def add_launch(self, judged: Sequence[Judged]) -> None:
        """Count one launch's cases. On a GPU the first launch of a compile variant pays
        every kernel path's JIT compile: its kernel time is counted as compile time."""
        cold: str | None = None
        for j in judged:
            key = j.case.compile_variant()
            if key not in self.variants:
                self.variants.add(key)
                cold = variant_name(j.case) if self.jit else None
        for j in judged:
            self.cases += 1
            self.modes[j.case.batch.mode] += 1
            self.digest.update(j.case.digest().encode())
            timings = dict(j.timings)
            if cold is not None:
                compiled = timings.pop("kernels", 0.0)
                timings["compile"] = timings.get("compile", 0.0) + compiled
                self.compile_s[cold] = self.compile_s.get(cold, 0.0) + compiled
            add_times(self.timings, timings)
            if len(j.launch) > 1:
                self.packed_cases += 1
            self._count_paths(j)
        self.launches += 1

    def add_later(self, judged: Sequence[Judged]) -> None:
        """Count the verdicts of paths that judged a launch after the others had (their
        module was still building then): per path and in the timings, not as cases again."""
        for j in judged:
            add_times(self.timings, j.timings)
            self._count_paths(j)

    def _count_paths(self, j: Judged) -> None:
        for r in j.result.results:
            stats = self.paths.get(r.path)
            if stats is None:  # (not setdefault: it would build a tally per verdict)
                stats = self.paths[r.path] = _PathTally()
            if r.outcome is Outcome.UNSUPPORTED:
                stats.skipped += 1
                stats.skip_reasons[r.reason] += 1
            else:
                stats.run += 1
                stats.outcomes[r.outcome.value] += 1
                stats.seconds += r.seconds
                if r.outcome is Outcome.IGNORES:
                    stats.ignored[r.detail] += 1

    def snapshot(
        self,
        *,
        groups: Sequence[GroupRecord],
        unavailable: dict[str, str],
        quarantined: dict[str, str],
        environment: Environment,
        wall_s: float,
        interrupted: bool,
        stop_reason: str,
        health: Sequence[HealthIssue] = (),
        plan: PlanStats | None = None,
        died: Sequence[str] = (),
        path_names: Sequence[str] = (),
        compile_ahead: AheadStats | None = None,
    ) -> CampaignReport:
        names = list(dict.fromkeys([*path_names, *self.paths]))
        paths = {
            n: PathStats(
                run=(t := self.paths.get(n, _PathTally())).run,
                skipped=t.skipped,
                outcomes=dict(t.outcomes),
                skip_reasons=dict(t.skip_reasons),
                seconds=t.seconds,
                quarantined=quarantined.get(n),
                ignored=dict(t.ignored),
            )
            for n in names
        }
        return CampaignReport(
            config=self.config,
            cases=self.cases,
            case_digest=self.digest.hexdigest()[:16],
            wall_s=wall_s,
            groups=tuple(groups),
            findings=tuple(self.findings),
            paths=paths,
            unavailable=dict(unavailable),
            environment=environment,
            timings=dict(self.timings),
            variants=len(self.variants),
            launches=self.launches,
            packed_cases=self.packed_cases,
            modes=dict(self.modes),
            interrupted=interrupted,
            stop_reason=stop_reason,
            health=tuple(health),
            plan=plan or PlanStats(),
            died=tuple(died),
            compile_s=dict(self.compile_s),
            compile_ahead=compile_ahead,
            out_dir=str(self.config.out_dir),
        )
