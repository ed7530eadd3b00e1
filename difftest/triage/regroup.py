"""Regrouping: the findings of an earlier run sorted again against today's known bugs.

A campaign groups its findings against the corpus it was started with. When the corpus has
changed since (a bug was filed and registered, an entry gained a trigger), or the run came from
another team, ``difftest triage DIR`` sorts the same findings again:

- the earlier run's established groups keep their triggers (each was found by ablation on that
  run's shrunk case) and their minimal repros;
- the corpus's known bugs come in as established groups of their own, as in a campaign; an
  earlier group with a known bug's key becomes that known group;
- every logged finding is then assigned as a campaign assigns it (:meth:`Triage.assign`).

Assignment needs the campaign's one rerun ("with the trigger's features reset, does the case
still fail that way?"). ``recheck`` makes it when the finding's path can run here. Without it
(``None`` from every recheck) a group takes a finding whose case *has* its trigger's
features: a case with a known bug's features that fails for another reason is then put with
the known bug. The result says which of the two was done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from difftest.judgement.signature import Signature
from difftest.model.case import Case
from difftest.model.outcome import PathResult
from difftest.triage.groups import Group, GroupRecord, KnownBug, Member, Recheck, Triage
from difftest.triage.trigger import Trigger


@dataclass(frozen=True, slots=True, kw_only=True)
class EarlierGroup:
    """An established group of the earlier run, as its run directory recorded it."""

    signature: Signature
    trigger: tuple[str, ...]
    id: str
    minimal: Case | None = None
    minimal_result: PathResult | None = None
    repro: str | None = None
    shrinks: int = 0
    shrink_runs: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Logged:
    """One earlier finding and the id of the group the earlier run put it in."""

    member: Member
    was: str


@dataclass(slots=True)
class Regrouped:
    groups: list[GroupRecord]
    moved: dict[str, Counter[str]] = field(default_factory=dict)
    """For each group now: how many of its findings came from each earlier group id."""
    rechecks: int = 0
    """Reruns made to confirm assignments (0: assigned by trigger features only)."""
    findings: int = 0

    @property
    def unsorted(self) -> int:
        """Findings no established group explains (they need a shrink to get a group)."""
        return sum(g.count for g in self.groups if not g.established)


def regroup(
    logged: Sequence[Logged],
    earlier: Sequence[EarlierGroup],
    known: Sequence[KnownBug],
    *,
    cases: int,
    recheck: Recheck | None = None,
) -> Regrouped:
    """Sort ``logged`` into ``earlier``'s groups and ``known``'s (see the module docstring)."""
    triage = Triage(known)
    for old in earlier:
        key = tuple(sorted(old.trigger))
        group = next(
            (
                g
                for g in triage.groups
                if g.established and g.signature == old.signature and g.key.trigger == key
            ),
            None,
        )
        if group is None:
            group = Group(signature=old.signature, trigger=Trigger(labels=key))
            triage.groups.append(group)
        if old.minimal is not None and (
            group.minimal is None or old.minimal.size() < group.minimal.size()
        ):
            group.minimal, group.minimal_result = old.minimal, old.minimal_result
            group.repro = old.repro
        group.shrinks += old.shrinks
        group.shrink_runs += old.shrink_runs
    reruns = 0

    def check(case: Case, signature: Signature) -> bool | None:
        nonlocal reruns
        if recheck is None:
            return None  # cannot rerun: a case with the trigger's features is explained
        reruns += 1
        return recheck(case, signature)

    placed: list[tuple[Group, str]] = []
    for item in logged:
        placed.append((triage.assign(item.member, check), item.was))
    moved: dict[int, Counter[str]] = {}
    for group, was in placed:
        moved.setdefault(id(group), Counter())[was] += 1
    live = triage.live()
    records = triage.records(cases)
    by_group = {id(g): g.id for g in live}
    return Regrouped(
        groups=records,
        moved={by_group[k]: v for k, v in moved.items()},
        rechecks=reruns,
        findings=len(logged),
    )
