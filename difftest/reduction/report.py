"""What a shrink did: the typed report a repro file keeps in its ``shrink`` block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from difftest.judgement.signature import Signature
from difftest.model.strict_json import Reader


@dataclass(frozen=True, slots=True, kw_only=True)
class Slip:
    """A failure of another signature met while shrinking (kept, never followed)."""

    digest: str
    signature: Signature
    reason: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "signature": self.signature.to_json(),
            "reason": self.reason,
            "size": self.size,
        }

    @classmethod
    def from_json(cls, r: Reader) -> Slip:
        r.only("digest", "signature", "reason", "size")
        sig = r.obj("signature", required=True)
        assert sig is not None
        return cls(
            digest=r.text("digest", required=True),
            signature=Signature.from_json(sig),
            reason=r.text("reason"),
            size=r.integer("size", 0, minimum=0) or 0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ShrinkReport:
    """One shrink: whether the original reproduced, sizes (:meth:`Case.size`) and digests
    before and after, the runs and seconds spent against the budget, the passes that made
    progress, and the other failures met on the way."""

    reproduced: bool
    original_size: int
    shrunk_size: int
    original_digest: str
    shrunk_digest: str
    runs: int
    seconds: float
    signature: Signature | None = None
    rejected_unsupported: int = 0
    max_runs: int | None = None
    max_seconds: float | None = None
    exhausted: bool = False
    """The budget ran out before a fixed point: a larger budget may shrink further."""
    passes: dict[str, int] = field(default_factory=dict)
    """Pass name -> candidates it got accepted."""
    slips: tuple[Slip, ...] = ()
    message: str = ""
    """Why the shrink did not happen, when it did not (the original did not reproduce...)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "reproduced": self.reproduced,
            "original_size": self.original_size,
            "shrunk_size": self.shrunk_size,
            "original_digest": self.original_digest,
            "shrunk_digest": self.shrunk_digest,
            "runs": self.runs,
            "seconds": round(self.seconds, 3),
            "signature": self.signature.to_json() if self.signature else None,
            "rejected_unsupported": self.rejected_unsupported,
            "budget": {"max_runs": self.max_runs, "max_seconds": self.max_seconds},
            "exhausted": self.exhausted,
            "passes": dict(self.passes),
            "slips": [s.to_json() for s in self.slips],
            "message": self.message,
        }

    @classmethod
    def from_json(cls, r: Reader) -> ShrinkReport:
        # ``first``, ``rerun`` and ``rerun_signature`` were kept by older versions when the
        # original did not reproduce: read and dropped (the message says it).
        r.only(
            *(
                "reproduced original_size shrunk_size original_digest shrunk_digest runs "
                "seconds signature rejected_unsupported budget exhausted passes slips message "
                "first rerun rerun_signature"
            ).split()
        )
        budget = r.obj("budget")
        sig = r.obj("signature")
        return cls(
            reproduced=r.flag("reproduced", required=True),
            original_size=r.integer("original_size", 0, minimum=0) or 0,
            shrunk_size=r.integer("shrunk_size", 0, minimum=0) or 0,
            original_digest=r.text("original_digest"),
            shrunk_digest=r.text("shrunk_digest"),
            runs=r.integer("runs", 0, minimum=0) or 0,
            seconds=r.number("seconds", 0.0, minimum=0.0) or 0.0,
            signature=Signature.from_json(sig) if sig is not None else None,
            rejected_unsupported=r.integer("rejected_unsupported", 0, minimum=0) or 0,
            max_runs=budget.integer("max_runs", minimum=0) if budget else None,
            max_seconds=budget.number("max_seconds", finite=False) if budget else None,
            exhausted=r.flag("exhausted"),
            passes=r.int_map("passes"),
            slips=tuple(Slip.from_json(s) for s in r.objs("slips", max_items=1024)),
            message=r.text("message"),
        )
