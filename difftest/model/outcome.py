"""Outcomes: the closed set of things that can happen when a path runs a case, and the typed
records that carry them between layers (verdicts, their metrics and error locations, a case's
results, a finding). Each is a frozen value with ``to_json``/``from_json``; ``from_json`` reads
untrusted files strictly (:mod:`difftest.model.strict_json`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Any

from difftest.model.errors import shown
from difftest.model.strict_json import Reader


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
    GRAPH_MISMATCH = "GRAPH_MISMATCH"
    """A CUDA-graph replay of the case gave other bits than the same call run eagerly (the
    inputs that differ between the two are in the metrics' ``graph``)."""
    AGREE = "AGREE"
    """Within tolerance everywhere."""
    IGNORES = "IGNORES"
    """Within the tolerance of exact attention, on a case that set an argument the path does
    not apply (``detail`` names it): whoever set it is told that it had no effect."""
    UNSUPPORTED = "UNSUPPORTED"
    """The path does not support this case here (the reason says why); not run."""

    @property
    def is_finding(self) -> bool:
        return self not in (Outcome.AGREE, Outcome.IGNORES, Outcome.UNSUPPORTED)


def _read_outcome(r: Reader, key: str) -> Outcome:
    text = r.text(key, required=True)
    try:
        return Outcome(text)
    except ValueError:
        names = ", ".join(o.value for o in Outcome)
        raise r.fail(key, f"unknown outcome {shown(text)} (one of {names})") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorLocation:
    """Where one wrong request is wrong: its query rows and heads, its worst error and bound."""

    request: int
    rows: tuple[int, ...]
    heads: tuple[int, ...]
    max_abs: float
    bound: float

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "rows": list(self.rows),
            "heads": list(self.heads),
            "max_abs": self.max_abs,
            "bound": self.bound,
        }

    @classmethod
    def from_json(cls, r: Reader) -> ErrorLocation:
        r.only("request", "rows", "heads", "max_abs", "bound")
        return cls(
            request=r.integer("request", required=True, minimum=0) or 0,
            rows=r.integers("rows", minimum=0),
            heads=r.integers("heads", minimum=0),
            max_abs=r.number("max_abs", required=True, finite=False) or 0.0,
            bound=r.number("bound", required=True, finite=False) or 0.0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostArg:
    """A host-side argument (or host shape) a graph replay ran with that the eager call did
    not: fixed when the graph was captured."""

    name: str
    replay: float
    eager: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "replay": self.replay, "eager": self.eager}

    @classmethod
    def from_json(cls, r: Reader) -> HostArg:
        r.only("name", "replay", "eager")
        return cls(
            name=r.text("name", required=True),
            replay=r.number("replay", required=True) or 0.0,
            eager=r.number("eager", required=True) or 0.0,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphDiff:
    """How a graph replay of a case differed from the eager call: in its inputs (what earlier
    batches left in the static buffers, the host arguments of the capture) and in its bits."""

    captured: bool
    """A CUDA graph was captured and replayed; ``False``: the same call was replayed on the
    static buffers (a path without a capture of its own, or a CPU)."""
    differing_elements: int
    """Output elements of the real requests whose bits differ from the eager call's."""
    max_abs: float
    """Largest ``|replay - eager|`` over those elements (inf where one of them is NaN)."""
    stale_columns: int
    """Page-table columns past the case's width the kernel was given (stale page ids)."""
    stale_pages: int
    """Pool pages past the case's pages (stale K/V)."""
    stale_query_rows: int
    """Query rows of padding requests and data-parallel padding left as earlier batches left
    them (the eager call's were generated)."""
    host_args: tuple[HostArg, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "captured": self.captured,
            "differing_elements": self.differing_elements,
            "max_abs": self.max_abs,
            "stale_columns": self.stale_columns,
            "stale_pages": self.stale_pages,
            "stale_query_rows": self.stale_query_rows,
            "host_args": [h.to_json() for h in self.host_args],
        }

    @classmethod
    def from_json(cls, r: Reader) -> GraphDiff:
        r.only(
            "captured",
            "differing_elements",
            "max_abs",
            "stale_columns",
            "stale_pages",
            "stale_query_rows",
            "host_args",
        )
        return cls(
            captured=r.flag("captured", required=True),
            differing_elements=r.integer("differing_elements", required=True, minimum=0) or 0,
            max_abs=r.number("max_abs", required=True, finite=False) or 0.0,
            stale_columns=r.integer("stale_columns", minimum=0) or 0,
            stale_pages=r.integer("stale_pages", minimum=0) or 0,
            stale_query_rows=r.integer("stale_query_rows", minimum=0) or 0,
            host_args=tuple(HostArg.from_json(h) for h in r.objs("host_args", max_items=16)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """The measurements behind a verdict. Every field is optional: a judged output has the
    error statistics, a nondeterministic one the rerun's, a lost worker its exit code or
    deadline and its last output lines. ``None`` fields are left out of the JSON."""

    max_abs: float | None = None
    """Largest finite ``|out - oracle|`` (NaN when no element was finite)."""
    rel_l2: float | None = None
    mismatch_fraction: float | None = None
    """Share of elements over their request's bound."""
    nonfinite: int | None = None
    unwritten_rows: int | None = None
    """Query rows left all NaN (never written)."""
    max_bound: float | None = None
    """The largest bound the verdict was decided against: the absolute allowance alone
    (``atol_ulps``, plus any skip allowance) when every row's error is within it (the noise
    floor could only widen it, and is then not needed), else the whole bound."""
    scale_ratio: float | None = None
    """Least-squares ``out / oracle`` over the finite elements: 1 when right; a constant
    other than 1 when the output misses (or doubles) a scale."""
    errors: tuple[ErrorLocation, ...] = ()
    """Per wrong request, worst first (at most :data:`MAX_LOCATED_REQUESTS`)."""
    nondeterministic_elements: int | None = None
    rerun_max_abs: float | None = None
    exitcode: int | None = None
    """A dead worker's exit code (negative: the signal)."""
    deadline_s: float | None = None
    """A hang: the deadline that passed."""
    worker_output: tuple[str, ...] = ()
    """The last lines a dead or stopped worker wrote."""
    skip_allowance: float | None = None
    """Skip-softmax: the largest error the skipped KV tiles may add, over the requests (added
    to each request's bound; ``docs/semantics.md``, "Skip-softmax")."""
    beyond_exact: int | None = None
    """Skip-softmax: elements past the exact-attention bound, within the allowance (evidence
    that tiles were skipped)."""
    graph: GraphDiff | None = None
    """A graph replay's inputs and bits against the eager call's."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if f.name == "graph":
                value = value.to_json()
            elif f.name == "errors":
                value = [e.to_json() for e in value]
            elif f.name == "worker_output":
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, r: Reader | None) -> Metrics:
        if r is None:
            return cls()
        r.only(*(f.name for f in fields(cls)))
        return cls(
            max_abs=r.number("max_abs", finite=False),
            rel_l2=r.number("rel_l2", finite=False),
            mismatch_fraction=r.number("mismatch_fraction", finite=False),
            nonfinite=r.integer("nonfinite", minimum=0),
            unwritten_rows=r.integer("unwritten_rows", minimum=0),
            max_bound=r.number("max_bound", finite=False),
            scale_ratio=r.number("scale_ratio", finite=False),
            errors=tuple(ErrorLocation.from_json(e) for e in r.objs("errors", max_items=64)),
            nondeterministic_elements=r.integer("nondeterministic_elements", minimum=0),
            rerun_max_abs=r.number("rerun_max_abs", finite=False),
            exitcode=r.integer("exitcode"),
            deadline_s=r.number("deadline_s", finite=False),
            worker_output=r.texts("worker_output", max_items=256),
            skip_allowance=r.number("skip_allowance", finite=False),
            beyond_exact=r.integer("beyond_exact", minimum=0),
            graph=GraphDiff.from_json(g) if (g := r.obj("graph")) is not None else None,
        )

    def same_as(self, other: Metrics) -> bool:
        """Every field this (recorded) verdict has equals ``other``'s, NaN equal to NaN: a
        replay that reproduces bit for bit. (A field a file written by an older version does
        not have is not compared.)"""
        mine, theirs = self.to_json(), other.to_json()
        return _same(mine, {k: theirs[k] for k in mine if k in theirs})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)


@dataclass(frozen=True, slots=True, kw_only=True)
class PathResult:
    """The verdict on one path for one case."""

    path: str
    outcome: Outcome
    reason: str = ""
    """One line for people: why (the skip reason, the exception, the worst error and its
    bound). Nothing is ever parsed out of it: :attr:`detail` carries the identity."""
    detail: str = ""
    """What tells failures of one kind apart, set where the verdict is made: for ``WRONG``,
    ``"unwritten"`` or ``"tolerance"``; for ``RAISED``, the exception type or ``"bad-shape"``;
    otherwise empty."""
    metrics: Metrics = field(default_factory=Metrics)
    seconds: float = 0.0
    backend: str = ""
    """The backend that ran, as the path's library reported it (empty: the path chooses
    none, or it did not run)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "detail": self.detail,
            "metrics": self.metrics.to_json(),
            "seconds": round(self.seconds, 6),
        }
        if self.backend:
            data["backend"] = self.backend
        return data

    @classmethod
    def from_json(cls, r: Reader) -> PathResult:
        r.only("path", "outcome", "reason", "detail", "metrics", "seconds", "backend")
        return cls(
            path=r.text("path", required=True),
            outcome=_read_outcome(r, "outcome"),
            reason=r.text("reason"),
            detail=r.text("detail"),
            metrics=Metrics.from_json(r.obj("metrics")),
            seconds=r.number("seconds", 0.0, minimum=0.0) or 0.0,
            backend=r.text("backend"),
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

    @classmethod
    def from_json(cls, r: Reader) -> PairAgreement:
        r.only("first", "second", "agree", "max_abs", "bad_requests")
        return cls(
            first=r.text("first", required=True),
            second=r.text("second", required=True),
            agree=r.flag("agree", required=True),
            max_abs=r.number("max_abs", 0.0, finite=False) or 0.0,
            bad_requests=r.integers("bad_requests", minimum=0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    """Every path's verdict on one case, how the paths compare, and where the time went."""

    case_digest: str
    results: tuple[PathResult, ...]
    pairs: tuple[PairAgreement, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per activity (generate, oracle, kernels, compare, isolation, ...)."""

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

    @classmethod
    def from_json(cls, r: Reader) -> CaseResult:
        r.only("case_digest", "results", "pairs", "timings")
        return cls(
            case_digest=r.text("case_digest", required=True),
            results=tuple(PathResult.from_json(x) for x in r.objs("results", max_items=256)),
            pairs=tuple(PairAgreement.from_json(x) for x in r.objs("pairs", max_items=4096)),
            timings=r.float_map("timings"),
        )


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

    @classmethod
    def from_json(cls, r: Reader) -> Finding:
        r.only("path", "kind", "reason", "against")
        return cls(
            path=r.text("path", required=True),
            kind=_read_outcome(r, "kind"),
            reason=r.text("reason"),
            against=r.text("against", "oracle"),
        )
