"""Outcomes: the closed set of things that can happen when a path runs a case."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    """What one path did with one case. The first group are findings."""

    WRONG = "WRONG"
    """Outside the tolerance of the oracle in some request, or rows never written."""
    NONFINITE = "NONFINITE"
    """NaN or inf where the oracle is finite."""
    RAISED = "RAISED"
    """The kernel API or an argument contract refused a case the path claims to support."""
    CRASH = "CRASH"
    """The process died, or a sticky device error (illegal memory access) poisoned it."""
    HANG = "HANG"
    """The path did not return before its deadline."""
    NONDETERMINISTIC = "NONDETERMINISTIC"
    """Identical reruns gave different bits on a path that declares itself deterministic."""
    AGREE = "AGREE"
    """Within tolerance everywhere."""
    UNSUPPORTED = "UNSUPPORTED"
    """The path does not support this case here (the reason says why); not run."""

    @property
    def is_finding(self) -> bool:
        return self not in (Outcome.AGREE, Outcome.UNSUPPORTED)


@dataclass(frozen=True, slots=True, kw_only=True)
class PathResult:
    """The verdict on one path for one case."""

    path: str
    outcome: Outcome
    reason: str = ""
    """One line: why (the skip reason, the exception, the worst error and its bound)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "metrics": self.metrics,
            "seconds": round(self.seconds, 6),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PathResult:
        return cls(
            path=str(data["path"]),
            outcome=Outcome(data["outcome"]),
            reason=str(data.get("reason", "")),
            metrics=dict(data.get("metrics", {})),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PairAgreement:
    """Whether two paths agree with each other (each within its own bound of the oracle)."""

    first: str
    second: str
    agree: bool
    max_abs: float
    bad_requests: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "second": self.second,
            "agree": self.agree,
            "max_abs": self.max_abs,
            "bad_requests": list(self.bad_requests),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """Every path's verdict on one case, how the paths compare, and where the time went."""

    case_digest: str
    results: tuple[PathResult, ...]
    pairs: tuple[PairAgreement, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)

    def findings(self) -> list[PathResult]:
        return [r for r in self.results if r.outcome.is_finding]

    def result_for(self, path: str) -> PathResult | None:
        return next((r for r in self.results if r.path == path), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "case_digest": self.case_digest,
            "results": [r.to_json() for r in self.results],
            "pairs": [p.to_json() for p in self.pairs],
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """What went wrong: the path, the kind of failure and its one-line reason."""

    path: str
    kind: Outcome
    reason: str = ""
    against: str = "oracle"
    """What the path disagrees with (the oracle, or another path)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "reason": self.reason,
            "against": self.against,
        }
