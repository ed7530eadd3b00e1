"""Health checks: runs that work but test little, named, measured, explained, with the fix.

In the manner of Hypothesis's ``HealthCheck``: each check says what it measured, why it
matters, what to do about it, and how to silence it (``--suppress-health-check NAME``).

- ``no_case_ran`` (an error: the command exits 2): no chosen path ran a single case (every
  case was unsupported, no chosen path can run here, or the budget was spent before the
  first case ended, most often waiting for its kernel modules to build). A run that tests
  nothing must not read as a pass.
- ``mostly_skipped``: a chosen path skipped most cases; the top reasons and the share of the
  wall time those cases took are given.
- ``slow_compile``: a compile variant's first launch took more than a quarter of the budget.
- ``quarantined``: a path crashed or hung repeatedly and was taken out of the run.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]
MOSTLY = 0.5
"""A path that skipped more than this share of the cases gets ``mostly_skipped``."""
SLOW_COMPILE_SHARE = 0.25


class HealthCheck(str, enum.Enum):
    NO_CASE_RAN = "no_case_ran"
    MOSTLY_SKIPPED = "mostly_skipped"
    SLOW_COMPILE = "slow_compile"
    QUARANTINED = "quarantined"


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthIssue:
    check: HealthCheck
    severity: Severity
    message: str

    def line(self) -> str:
        return (
            f"health check {self.check.value} ({self.severity}): {self.message} "
            f"[--suppress-health-check {self.check.value}]"
        )

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check.value, "severity": self.severity, "message": self.message}


@dataclass(frozen=True, slots=True, kw_only=True)
class PathUse:
    """What one chosen path did in a run (what the checks read)."""

    name: str
    ran: int
    skipped: int
    skip_reasons: Mapping[str, int]
    skip_seconds: float = 0.0
    quarantined: str | None = None
    unavailable: str | None = None


def check_health(
    uses: Iterable[PathUse],
    *,
    cases: int,
    wall_s: float,
    budget_s: float | None = None,
    compile_s: Mapping[str, float] | None = None,
    budget_spent: bool = False,
    compile_wait_s: float = 0.0,
    suppress: Iterable[str] = (),
    interrupted: bool = False,
) -> list[HealthIssue]:
    """The issues of a run (suppressed checks left out). ``budget_spent``: the run stopped
    because its budget ran out (``compile_wait_s`` of it waiting on module builds).
    ``interrupted``: it was stopped (a signal): that no case ran is then the stop's doing, not
    a setup error (the run reports itself interrupted and exits 1)."""
    uses = list(uses)
    off = set(suppress)
    issues: list[HealthIssue] = []
    if not any(u.ran for u in uses) and not interrupted:
        issues.append(
            HealthIssue(
                check=HealthCheck.NO_CASE_RAN,
                severity="error",
                message=_nothing_ran(uses, cases, budget_s, budget_spent, compile_wait_s),
            )
        )
    for u in uses:
        total = u.ran + u.skipped
        if u.ran and total and u.skipped / total > MOSTLY and not (u.unavailable or u.quarantined):
            top = sorted(u.skip_reasons.items(), key=lambda kv: -kv[1])[:3]
            share = u.skip_seconds / wall_s if wall_s > 0 else 0.0
            issues.append(
                HealthIssue(
                    check=HealthCheck.MOSTLY_SKIPPED,
                    severity="warning",
                    message=f"{u.name} skipped {u.skipped} of {total} cases "
                    f"({u.skipped / total:.0%}; they took {share:.0%} of the wall time): "
                    + "; ".join(f"{n}x {r}" for r, n in top)
                    + ". Its findings cover few cases: give it a preset it supports, or run "
                    "it alone with --paths (cases are then drawn for it)",
                )
            )
        if u.quarantined:
            issues.append(
                HealthIssue(
                    check=HealthCheck.QUARANTINED,
                    severity="warning",
                    message=f"{u.name} {u.quarantined}; its findings are kept, the other "
                    "paths ran at full rate. Replay its CRASH/HANG repros (isolated) to see why",
                )
            )
    if budget_s is not None and compile_s:
        for variant, seconds in compile_s.items():
            if seconds > SLOW_COMPILE_SHARE * budget_s:
                issues.append(
                    HealthIssue(
                        check=HealthCheck.SLOW_COMPILE,
                        severity="warning",
                        message=f"compile variant {variant} took {seconds:.0f}s to build, over "
                        f"a quarter of the {budget_s:g}s budget: run `difftest warmup` first "
                        "(or keep built modules), or raise --budget-s",
                    )
                )
    return [i for i in issues if i.check.value not in off]


def _nothing_ran(
    uses: list[PathUse],
    cases: int,
    budget_s: float | None,
    budget_spent: bool,
    compile_wait_s: float,
) -> str:
    """Why no chosen path ran a case, and what to do: the budget ran out before the first case
    ended, or the paths supported none of the cases, or none can run here."""
    if not cases and budget_spent and budget_s is not None:
        waited = (
            f", {compile_wait_s:.1f}s of it waiting on kernel module builds"
            if compile_wait_s > 0
            else ""
        )
        fix = "raise --budget-s" + (
            ", or build the modules first (difftest warmup)" if waited else ""
        )
        return (
            f"0 cases: the {budget_s:g}s budget was spent before the first case ended{waited}. "
            f"Nothing was tested: {fix}"
        )
    why = "every case was unsupported on every chosen path" if cases else "no case could be run"
    reasons = [f"{u.name}: {u.unavailable}" for u in uses if u.unavailable]
    reasons += [
        f"{u.name}: {max(u.skip_reasons, key=lambda r: u.skip_reasons[r])}"
        for u in uses
        if not u.unavailable and u.skip_reasons
    ]
    return (
        f"{cases} cases, none run on any chosen path: {why}"
        + (f" ({'; '.join(reasons[:4])})" if reasons else "")
        + ". Nothing was tested: choose paths that run here (difftest paths) or "
        "cases they support (--preset, --mode)"
    )
