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
apart rather than merged. No known bug is matched against them as a single finding is (a
known group takes a finding only when its trigger's reset makes the failure go away, a rerun
of the case; a launch is not rerun so), so every packed-only group is unexpected until
someone triages it. What a group does say is which known bugs it **likely** is: a corpus
entry's trigger can need what only the launch gives a case. The SGLang draft-mask entry needs
``requests>1`` (a request past the first reads another's mask rows), so a one-request case
of that convention agrees alone and fails as request ``b > 0`` of a launch; XQA's SM90 fp8
kernel splits a row between fewer CTAs the more requests its launch has. So each finding's
case is placed in its launch's batch (:func:`in_launch`: the launch's requests and prefixes,
the case's own scales, values and convention) and a known entry of the same path, outcome
and detail whose trigger that placed case has and the case alone has not is named
(:func:`likely_known`); a group names each such entry with how many of its findings it was
named for. A case that alone already has the trigger and agreed is not named for it (the
trigger does not say then why the launch failed it), so an entry can be named for only some
of a group's findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from difftest.execution.packing import packed_case
from difftest.judgement.signature import signature_of
from difftest.model.case import Case
from difftest.model.errors import InvalidCase
from difftest.model.outcome import Outcome, PathResult
from difftest.triage.features import matches
from difftest.triage.groups import KnownBug


def in_launch(case: Case, launch: Sequence[Case]) -> Case | None:
    """``case`` as its packed ``launch`` ran it, as one case: the launch's batch and pool
    shape (:func:`~difftest.execution.packing.packed_case`: every case's requests and
    prefixes) with ``case``'s own configuration (its scales), values and convention.
    ``None`` when the launch cannot be described so (fewer than two cases, or cases the
    packer would not put together)."""
    if len(launch) < 2:
        return None
    try:
        packed = packed_case(launch)
        return packed.replace(
            attention=case.attention, values=case.values, convention=case.convention
        )
    except (InvalidCase, ValueError):
        return None


def likely_known(
    case: Case, result: PathResult, launch: Sequence[Case], known: Sequence[KnownBug]
) -> tuple[str, ...]:
    """The known bugs a packed-only finding (``result`` on ``case``, wrong in ``launch``,
    right alone) likely is: the entries of its path, outcome and detail with a trigger that
    the case placed in its launch (:func:`in_launch`) has and the case alone has not. Not
    checked by a rerun (see the module docstring)."""
    placed = in_launch(case, launch)
    if placed is None:
        return ()
    signature = signature_of(result)
    return tuple(
        bug.name
        for bug in known
        if bug.signature() == signature
        and bug.trigger
        and matches(placed, bug.trigger)
        and not matches(case, bug.trigger)
    )


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
    likely_known: tuple[str, ...] = ()
    """:func:`likely_known` of it."""


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
    likely_known: tuple[tuple[str, int], ...] = ()
    """Each known bug some of its findings likely are (:func:`likely_known`), with how many
    of them: the most first."""

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
            *(
                f"    likely known: {name} for {n} of {self.count} (the case placed in its "
                "launch has its trigger, alone it has not; not rechecked)"
                for name, n in self.likely_known
            ),
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
            likely_known=dict(self.likely_known),
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
                likely_known=_named(found),
            )
        )
    groups.sort(key=lambda g: (-g.count, g.first_index))
    return groups


def _span(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return str(low) if low == high else f"{low}-{high}"


def _named(found: Sequence[PackedOnlyFinding]) -> tuple[tuple[str, int], ...]:
    """Each entry named for some of ``found``, with how many: the most first (ties: the one
    named first)."""
    counts: dict[str, int] = {}
    for f in found:
        for name in f.likely_known:
            counts[name] = counts.get(name, 0) + 1
    return tuple(sorted(counts.items(), key=lambda item: -item[1]))
