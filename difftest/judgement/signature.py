"""Failure signatures: what makes two failures "the same bug" for shrinking and replay.

A signature is the path, the outcome kind, what the path disagrees with, and a short detail that
separates failures of one kind that are clearly different bugs: for ``WRONG``, rows the kernel
never wrote versus values over tolerance; for ``RAISED``, the exception type. Request indices
and magnitudes are deliberately left out: shrinking drops requests and changes values, and the
same bug must keep its signature while it does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from difftest.model.errors import FormatError
from difftest.model.outcome import Outcome, PathResult

_EXCEPTION_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(?::|$)")


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

    @property
    def is_failure(self) -> bool:
        return self.kind.is_finding

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
    def from_json(cls, data: Any, *, source: str = "signature") -> Signature:
        if not isinstance(data, dict):
            raise FormatError(source, "a signature must be a JSON object")
        try:
            return cls(
                path=str(data["path"]),
                kind=Outcome(data["kind"]),
                against=str(data.get("against", "oracle")),
                detail=str(data.get("detail", "")),
            )
        except (KeyError, ValueError) as e:
            raise FormatError(source, f"malformed signature: {e}") from None


def detail_of(result: PathResult) -> str:
    """The signature detail of ``result`` (see :attr:`Signature.detail`)."""
    if result.outcome is Outcome.WRONG:
        return "unwritten" if result.metrics.get("unwritten_rows") else "tolerance"
    if result.outcome is Outcome.RAISED:
        if result.reason.startswith("returned "):
            return "bad-shape"
        match = _EXCEPTION_NAME.match(result.reason)
        return match.group(1) if match else ""
    return ""


def signature_of(result: PathResult, against: str = "oracle") -> Signature:
    """The signature of one path's verdict."""
    return Signature(
        path=result.path, kind=result.outcome, against=against, detail=detail_of(result)
    )
