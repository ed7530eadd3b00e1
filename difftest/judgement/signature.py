"""Failure signatures: what makes two failures "the same bug" for shrinking and replay.

A signature is the path, the outcome kind, what the path disagrees with, and a short detail that
separates failures of one kind that are clearly different bugs: for ``WRONG``, rows the kernel
never wrote versus values over tolerance; for ``RAISED``, the exception type. Request indices
and magnitudes are deliberately left out: shrinking drops requests and changes values, and the
same bug must keep its signature while it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from difftest.model.errors import shown
from difftest.model.outcome import Outcome, PathResult
from difftest.model.strict_json import Reader


@dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    """The identity of a failure: ``path``, ``kind``, ``against`` and ``detail``."""

    path: str
    kind: Outcome
    against: str = "oracle"
    """What the path disagrees with (the runner judges every path against the oracle)."""
    detail: str = ""
    """``WRONG``: ``"unwritten"`` or ``"tolerance"``; ``RAISED``: the exception type or
    ``"bad-shape"``; otherwise empty."""

    def same_failure(self, other: Signature) -> bool:
        """Same kind, detail and reference, whatever the path (replay against other paths).

        An empty detail here (a hand-written repro, no recorded result) matches any detail.
        """
        detail = other.detail if not self.detail else self.detail
        return (self.kind, self.against, detail) == (other.kind, other.against, other.detail)

    def matches(self, other: Signature) -> bool:
        """``other`` is this failure: same path and :meth:`same_failure`."""
        return self.path == other.path and self.same_failure(other)

    def outcome_text(self) -> str:
        """``"WRONG (tolerance) vs oracle"``: the signature without its path."""
        detail = f" ({self.detail})" if self.detail else ""
        against = f" vs {self.against}" if self.kind in (Outcome.WRONG, Outcome.NONFINITE) else ""
        return f"{self.kind.value}{detail}{against}"

    def describe(self) -> str:
        return f"{self.path} {self.outcome_text()}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "against": self.against,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, r: Reader) -> Signature:
        r.only("path", "kind", "against", "detail")
        text = r.text("kind", required=True)
        try:
            kind = Outcome(text)
        except ValueError:
            raise r.fail("kind", f"unknown outcome {shown(text)}") from None
        return cls(
            path=r.text("path", required=True),
            kind=kind,
            against=r.text("against", "oracle"),
            detail=r.text("detail"),
        )


def signature_of(result: PathResult, against: str = "oracle") -> Signature:
    """The signature of one path's verdict."""
    return Signature(path=result.path, kind=result.outcome, against=against, detail=result.detail)
