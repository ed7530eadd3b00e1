"""Packed-only findings sorted into groups, so that a run says which launch-only bugs it met.

A packed-only finding is a case that failed inside a packed launch and agreed when it ran
alone (:mod:`difftest.execution.launches`): a kernel that mixes up the requests of one launch,
or a condition only the launch's size reaches (more requests, more tokens, a larger
workspace). The shrinker works on one case, so these are not shrunk; each is kept with its
whole launch as a repro file of its own (``packed/``). Without groups they were a count in the
findings list and nothing in the run's summary or exit code, however many there were.

The groups here are by what the finding is (path, outcome, detail) and by the case's compile
variant (dtypes, heads, head dim, page size, ``L``, draft, layout): a launch-only bug is
usually a property of one kernel instantiation, and two variants failing apart are reported
apart rather than merged. No known bug is matched against them: a corpus entry's trigger
describes single cases, so every packed-only group is unexpected until someone triages it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from difftest.model.outcome import Outcome


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedOnlyFinding:
    """What the grouping reads of one packed-only finding (the report's finding record)."""

    path: str
    kind: Outcome
    detail: str
    variant: str
    index: int
    case_digest: str
    repro: str | None
    requests: int
    """The case's requests (padding included), which it ran with alone."""
    launch_requests: int
    """Its launch's requests, all cases together."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedOnlyGroup:
    """Packed-only findings of one path, outcome, detail and compile variant."""

    path: str
    kind: Outcome
    detail: str
    variant: str
    count: int
    first_index: int
    """The campaign index of the first case that showed it."""
    digests: tuple[str, ...]
    repro: str | None
    """The first finding's repro file (its whole launch)."""
    requests: tuple[int, int]
    """The fewest and most requests of its cases alone."""
    launch_requests: tuple[int, int]
    """The fewest and most requests of the launches they failed in: beside :attr:`requests`,
    the first thing to look at (a kernel whose work split depends on the batch size fails
    only past some size)."""

    @property
    def id(self) -> str:
        return f"packed-only {self.path} {self.kind.value} {self.variant}"

    def lines(self, preset: str | None = None) -> list[str]:
        kind = self.kind.value + (f" ({self.detail})" if self.detail else "")
        where = f" [preset {preset}]" if preset else ""
        return [
            f"PACKED-ONLY: {self.path} {kind}{where}: {self.count} finding(s) (first at case "
            f"{self.first_index}), each case wrong in its packed launch and right alone",
            f"    variant: {self.variant}",
            f"    requests: {_span(self.requests)} a case alone, {_span(self.launch_requests)} in "
            "the launches it failed in",
            f"    repro (the whole launch, not shrunk): {self.repro}",
        ]

    def to_json(self) -> dict[str, Any]:
        """Every field by its name (the outcome by its value, tuples as lists), and the
        group's :attr:`id`."""
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            kind=self.kind.value,
            digests=list(self.digests),
            requests=list(self.requests),
            launch_requests=list(self.launch_requests),
        )
        return {"id": self.id, **data}


def packed_only_groups(findings: Iterable[PackedOnlyFinding]) -> list[PackedOnlyGroup]:
    """The findings grouped by path, outcome, detail and variant; the largest group first
    (ties: the one met first)."""
    members: dict[tuple[str, Outcome, str, str], list[PackedOnlyFinding]] = {}
    for f in findings:
        members.setdefault((f.path, f.kind, f.detail, f.variant), []).append(f)
    groups = []
    for (path, kind, detail, variant), found in members.items():
        found.sort(key=lambda f: f.index)
        groups.append(
            PackedOnlyGroup(
                path=path,
                kind=kind,
                detail=detail,
                variant=variant,
                count=len(found),
                first_index=found[0].index,
                digests=tuple(dict.fromkeys(f.case_digest for f in found)),
                repro=found[0].repro,
                requests=(min(f.requests for f in found), max(f.requests for f in found)),
                launch_requests=(
                    min(f.launch_requests for f in found),
                    max(f.launch_requests for f in found),
                ),
            )
        )
    groups.sort(key=lambda g: (-g.count, g.first_index))
    return groups


def _span(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"
