"""Groups: which findings are one bug.

A finding's group is its path, its kind (the outcome and its detail), what it disagrees with,
and its trigger (:mod:`difftest.triage.trigger`). The trigger is known only once a finding is
shrunk and ablated, so grouping is a refinement, as in fuzzer triage ("Taming compiler
fuzzers", PLDI 2013):

1. A new finding is checked against the *established* groups of its signature (path, kind,
   detail, reference): a group whose trigger the case has, most specific first, takes it if
   the case with that trigger's features reset no longer fails that way (one rerun; without
   it, a case that has one bug's features but fails from another would hide that other bug).
   A group with an empty trigger takes every finding of its signature without a rerun.
2. Otherwise the finding waits in its signature's *unsorted* pool. The pool's first finding
   is shrunk (:mod:`difftest.reduction`) while staying in no other established group, then
   ablated; its trigger makes a new group (or, if equal to an existing one, joins it), and the
   pool's other findings are checked against it as in 1.
3. Known bugs (:class:`KnownBug`, from the corpus) are established groups from the start:
   a group whose key equals one is labelled KNOWN with the entry's name.

A :class:`Triage` holds that state for one campaign; :class:`GroupRecord` is what the report,
the JSON and the gate read (its JSON keys are a stable contract).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from difftest.judgement.signature import Signature, signature_of
from difftest.model.case import Case
from difftest.model.outcome import Metrics, Outcome, PathResult
from difftest.model.strict_json import Reader
from difftest.triage.features import describe, matches, reset_all
from difftest.triage.trigger import Trigger

MAX_SHRINKS = 4
"""Shrinks one group may get (a shrink cut short by its budget is continued later)."""

Recheck = Callable[[Case, Signature], bool | None]
"""``recheck(case, signature)``: whether ``case`` still fails with ``signature`` (``None``:
it cannot be run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownBug:
    """A bug the corpus already has: its entry's name, path, kind, reference and trigger,
    and whether it is expected to show on the library versions installed here."""

    name: str
    path: str
    kind: Outcome
    detail: str = ""
    against: str = "oracle"
    trigger: tuple[str, ...] = ()
    expectation: str | None = None
    """The entry's expectation for the installed versions (``still_fails``, ``fixed``, ...),
    ``None``: the entry says nothing about them."""
    description: str = ""

    def signature(self) -> Signature:
        return Signature(path=self.path, kind=self.kind, against=self.against, detail=self.detail)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupKey:
    """The identity of a group."""

    signature: Signature
    trigger: tuple[str, ...]

    @property
    def id(self) -> str:
        """A short stable name: ``fi-decode-xqa-wrong-3f2a9c1e``."""
        text = "|".join([self.signature.describe(), *self.trigger])
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        return f"{self.signature.path}-{self.signature.kind.value.lower()}-{digest}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """What the error looks like, cheap to compute from one verdict."""

    scale_ratio: float | None = None
    """Least-squares ``out / oracle`` over the case (1 is right; 1/bmm2 means the output
    misses its scale)."""
    rows: str = ""
    """``all`` or ``some``: the share of a wrong request's query rows that are wrong."""
    heads: str = ""
    requests: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "scale_ratio": self.scale_ratio,
            "rows": self.rows,
            "heads": self.heads,
            "requests": self.requests,
        }

    @classmethod
    def from_json(cls, r: Reader) -> Fingerprint:
        return cls(
            scale_ratio=r.number("scale_ratio"),
            rows=r.text("rows"),
            heads=r.text("heads"),
            requests=r.text("requests"),
        )

    def words(self) -> str:
        parts = []
        if self.scale_ratio is not None:
            parts.append(f"out/oracle {self.scale_ratio:.4g}")
        for name in ("requests", "rows", "heads"):
            if getattr(self, name):
                parts.append(f"{getattr(self, name)} {name} wrong")
        return ", ".join(parts)


def fingerprint(case: Case, metrics: Metrics) -> Fingerprint:
    """The fingerprint of a verdict on ``case``."""
    errors = metrics.errors
    if not errors:
        return Fingerprint(scale_ratio=metrics.scale_ratio)
    b, a = case.batch, case.attention
    counts = b.new_tokens()
    rows = "all" if all(len(e.rows) == counts[e.request] for e in errors) else "some"
    heads = "all" if all(len(e.heads) == a.num_qo_heads for e in errors) else "some"
    requests = "all" if len(errors) == b.num_requests else "some"
    return Fingerprint(scale_ratio=metrics.scale_ratio, rows=rows, heads=heads, requests=requests)


@dataclass(slots=True)
class Member:
    """One finding: its case, its verdict, and the other paths failing on the same case."""

    case: Case
    result: PathResult
    other_paths: tuple[str, ...] = ()
    index: int = 0
    """The campaign index of its case (cases run before it + 1: cases to detection)."""


@dataclass(slots=True)
class Group:
    """One bug's findings (working state of a campaign; :meth:`record` is the snapshot)."""

    signature: Signature
    trigger: Trigger | None = None
    """``None`` while the group is provisional (its representative not yet shrunk)."""
    known: KnownBug | None = None
    members: list[Member] = field(default_factory=list)
    minimal: Case | None = None
    minimal_result: PathResult | None = None
    repro: str | None = None
    """The representative repro file (the minimal case once shrunk)."""
    shrinks: int = 0
    shrink_runs: int = 0
    exhausted: bool = False
    other_paths: Counter[str] = field(default_factory=Counter)
    joint: Counter[str] = field(default_factory=Counter)
    """Members that fail through this bug and another group's together (neither alone
    explains them, see :meth:`Triage.jointly_explained`), by the other group's name."""

    @property
    def name(self) -> str:
        """The known bug's corpus name, else the group's id."""
        return self.known.name if self.known else self.key.id

    @property
    def established(self) -> bool:
        return self.trigger is not None

    @property
    def id(self) -> str:
        """The group's id as its :meth:`record` gives it (``-unsorted`` until established),
        without the snapshot: a campaign names a finding's group once per finding, and the
        snapshot lists every member."""
        return self.key.id if self.established else f"{self.key.id}-unsorted"

    @property
    def key(self) -> GroupKey:
        return GroupKey(signature=self.signature, trigger=self.trigger.key if self.trigger else ())

    @property
    def representative(self) -> Member:
        return self.members[0]

    def add(self, member: Member) -> None:
        self.members.append(member)
        self.other_paths.update(member.other_paths)

    def record(self, cases: int) -> GroupRecord:
        rep = self.minimal or self.representative.case
        result = self.minimal_result or self.representative.result
        trigger = self.trigger.key if self.trigger else ()
        return GroupRecord(
            id=self.id,
            path=self.signature.path,
            kind=self.signature.kind,
            detail=self.signature.detail,
            against=self.signature.against,
            trigger=trigger,
            trigger_words=self.trigger.words() if self.trigger else "not yet shrunk",
            established=self.established,
            count=len(self.members),
            share=len(self.members) / cases if cases else 0.0,
            known=self.known.name if self.known else None,
            expectation=self.known.expectation if self.known else None,
            minimal=self.repro,
            minimal_size=rep.size() if self.minimal is not None else None,
            minimal_case=one_line(rep),
            cases_to_detection=self.representative.index,
            digests=tuple(m.case.digest() for m in self.members),
            other_paths=dict(self.other_paths),
            joint=dict(self.joint),
            fingerprint=fingerprint(rep, result.metrics),
            shrinks=self.shrinks,
            shrink_runs=self.shrink_runs,
            exhausted=self.exhausted,
            reason=result.reason,
        )


def one_line(case: Case) -> str:
    """A case in one line: what a kernel engineer needs to rebuild it by hand."""
    a, b, p = case.attention, case.batch, case.pool
    parts = [
        f"{len(b.prefix_lens)} req"
        + (f" (+{b.padding_requests} pad)" if b.padding_requests else ""),
        f"prefix {list(b.prefix_lens)}"
        if len(b.prefix_lens) <= 4
        else f"prefix max {max(b.prefix_lens)}",
        f"L={b.q_len}"
        + (f" new tokens {list(b.q_lens)}" if b.q_lens is not None and len(b.q_lens) <= 8 else "")
        + (" ragged" if b.q_lens is not None and len(b.q_lens) > 8 else "")
        + (" tree" if b.draft.kind == "tree" else ""),
        f"H {a.num_qo_heads}:{a.num_kv_heads} D={a.head_dim} page={a.page_size}",
        f"{a.q_dtype}/{a.kv_dtype}",
    ]
    if a.window_left >= 0:
        parts.append(f"window {a.window_left}")
    if a.sinks:
        parts.append("sinks")
    scales = [
        f"{n}={getattr(a, n):g}"
        for n in ("q_scale", "k_scale", "v_scale", "o_scale")
        if getattr(a, n) != 1.0
    ]
    if a.sm_scale is not None:
        scales.insert(0, f"sm_scale={a.sm_scale:g}")
    parts += scales
    if p.page_order != "sequential":
        parts.append(f"pages {p.page_order}")
    if p.table_width == "context":
        parts.append("context-wide table")
    if p.table_fill != "zero":
        parts.append(f"fill {p.table_fill}")
    if p.stale_fill != "zeros":
        parts.append(f"stale {p.stale_fill}")
    if p.kv_storage != "hnd":
        parts.append(p.kv_storage)
    if case.convention != "plain":
        parts.append(case.convention)
    if case.values.family != "randn" or case.values.scale != 1.0:
        parts.append(f"values {case.values.family} x{case.values.scale:g}")
    if a.skip_softmax_threshold_scale_factor is not None:
        parts.append(f"skip-softmax {a.skip_softmax_threshold_scale_factor:g}")
    g = case.graph
    if g is not None:
        extras = [
            f"{what} {n}"
            for what, n in (
                ("+requests", g.extra_requests),
                ("+columns", g.extra_columns),
                ("+pages", g.extra_pages),
                ("+max_seq_len", g.extra_max_seq_len),
            )
            if n
        ]
        if g.changes_scales:
            extras.append(f"captured bmm1 {g.bmm1_scale} bmm2 {g.bmm2_scale}")
        parts.append("graph" + (f" ({', '.join(extras)})" if extras else ""))
    return ", ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord:
    """One group as the report, the JSON and the gate see it."""

    id: str
    path: str
    kind: Outcome
    detail: str
    against: str
    trigger: tuple[str, ...]
    trigger_words: str
    established: bool
    count: int
    share: float
    known: str | None
    expectation: str | None
    minimal: str | None
    minimal_size: int | None
    minimal_case: str
    cases_to_detection: int
    digests: tuple[str, ...]
    other_paths: dict[str, int]
    joint: dict[str, int]
    """Findings explained by this bug and another at once, by the other's name."""
    fingerprint: Fingerprint
    shrinks: int
    shrink_runs: int
    exhausted: bool
    reason: str

    @property
    def is_new(self) -> bool:
        return self.known is None

    def lines(self, preset: str | None = None) -> list[str]:
        """The group in a few lines: what and how often, what it needs, its minimal case,
        its fingerprint and the other paths failing on it, its repro."""
        if self.known is None:
            label = "NEW"
        else:
            expected = (
                f"expected here: {self.expectation}"
                if self.expectation
                else "not checked on this version: its entry has no expectation for it"
            )
            label = f"KNOWN {self.known} ({expected})"
        kind = self.kind.value + (f" ({self.detail})" if self.detail else "")
        where = f" [preset {preset}]" if preset else ""
        out = [
            f"{label}: {self.path} {kind}{where}: {self.count} finding(s), {self.share:.1%} of "
            f"cases (first at case {self.cases_to_detection})",
            f"    needs: {self.trigger_words}",
        ]
        size = f"size {self.minimal_size}" if self.minimal_size is not None else "not shrunk"
        if self.minimal_size is None and self.known is not None:
            size += f"; corpus entry {self.known} holds its minimal repro"
        out.append(f"    minimal ({size}): {self.minimal_case}")
        extra = self.fingerprint.words()
        if self.other_paths:
            fails = ", ".join(f"{p} ({n})" for p, n in sorted(self.other_paths.items()))
            extra = (extra + "; " if extra else "") + f"also fails on {fails}"
        if extra:
            out.append(f"    {extra}")
        for other, n in sorted(self.joint.items()):
            out.append(
                f"    {n} of them fail through {other} too: neither bug alone explains them, "
                "the two together do"
            )
        out.append(f"    repro: {self.minimal}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "kind": self.kind.value,
            "detail": self.detail,
            "against": self.against,
            "trigger": list(self.trigger),
            "trigger_words": self.trigger_words,
            "established": self.established,
            "count": self.count,
            "share": round(self.share, 6),
            "known": self.known,
            "expectation": self.expectation,
            "minimal": self.minimal,
            "minimal_size": self.minimal_size,
            "minimal_case": self.minimal_case,
            "cases_to_detection": self.cases_to_detection,
            "digests": list(self.digests),
            "other_paths": self.other_paths,
            "joint": self.joint,
            "fingerprint": self.fingerprint.to_json(),
            "shrinks": self.shrinks,
            "shrink_runs": self.shrink_runs,
            "exhausted": self.exhausted,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> GroupRecord:
        """Read a record back (a run directory's ``groups.json``), strictly."""
        r = Reader(data, source, "group")
        kind = r.text("kind", required=True)
        try:
            outcome = Outcome(kind)
        except ValueError:
            raise r.fail("kind", f"unknown outcome {kind!r}") from None
        fp = r.obj("fingerprint")
        return cls(
            id=r.text("id", required=True),
            path=r.text("path", required=True),
            kind=outcome,
            detail=r.text("detail"),
            against=r.text("against", "oracle"),
            trigger=r.texts("trigger", max_items=64),
            trigger_words=r.text("trigger_words"),
            established=r.flag("established"),
            count=r.integer("count", 0, minimum=0) or 0,
            share=r.number("share") or 0.0,
            known=r.text("known") if r.has("known") else None,
            expectation=r.text("expectation") if r.has("expectation") else None,
            minimal=r.text("minimal") if r.has("minimal") else None,
            minimal_size=r.integer("minimal_size", None, minimum=0),
            minimal_case=r.text("minimal_case"),
            cases_to_detection=r.integer("cases_to_detection", 0, minimum=0) or 0,
            digests=r.texts("digests", max_items=10_000_000),
            other_paths=r.int_map("other_paths", max_items=4096),
            joint=r.int_map("joint", max_items=4096) if r.has("joint") else {},
            fingerprint=Fingerprint.from_json(fp) if fp is not None else Fingerprint(),
            shrinks=r.integer("shrinks", 0, minimum=0) or 0,
            shrink_runs=r.integer("shrink_runs", 0, minimum=0) or 0,
            exhausted=r.flag("exhausted"),
            reason=r.text("reason"),
        )


class Triage:
    """The groups of one campaign (see the module docstring)."""

    def __init__(self, known: Sequence[KnownBug] = ()) -> None:
        self.known = list(known)
        self.groups: list[Group] = []
        for bug in self.known:
            self.groups.append(
                Group(signature=bug.signature(), trigger=Trigger(labels=bug.trigger), known=bug)
            )
        self.rechecks = 0

    def _established(self, signature: Signature) -> list[Group]:
        found = [g for g in self.groups if g.established and g.signature == signature]
        return sorted(found, key=lambda g: -len(g.key.trigger))

    def unsorted(self, signature: Signature) -> Group | None:
        return next(
            (g for g in self.groups if not g.established and g.signature == signature), None
        )

    def rechecks_for(self, case: Case, signature: Signature) -> list[Case]:
        """The cases :meth:`assign` would recheck first for a finding of ``signature`` on
        ``case``: ``case`` with each matching established group's trigger reset (what
        :meth:`explained_by` asks of each group, in its order). A campaign runs a launch's
        rechecks together, ahead of assigning its findings."""
        return _resets(self._established(signature), case)

    def resets_of(self, case: Case, paths: Collection[str]) -> list[Case]:
        """``case`` with the trigger of each established group it matches reset, for the
        groups of ``paths`` whose bug may fail it here (a known bug its entry does not call
        fixed, and every group of this run): the cases a finding on ``case`` would be
        rechecked on.
        A campaign's compile-ahead builds their kernel modules behind ``case``'s, so a
        recheck does not wait for a compile (a reset trigger can need another module:
        ``L = 1`` for XQA); ``difftest bench`` builds them in its warmup when it builds in
        processes. A recheck that runs a compile variant first counts its kernel time as
        compile, not triage (``Session.recheck_compile_s``)."""

        def may_fail(group: Group) -> bool:
            known = group.known
            mine = group.signature.path in paths
            return mine and (known is None or known.expectation in (None, "still_fails"))

        return _resets([g for g in self.groups if g.established and may_fail(g)], case)

    def explained_by(self, group: Group, case: Case, recheck: Recheck) -> bool:
        """Whether ``case`` fails because of ``group``'s bug: it has the trigger, and (for a
        non-empty trigger) resetting the trigger's features makes the failure go away."""
        trigger = group.key.trigger
        if not matches(case, trigger):
            return False
        if not trigger:
            return True
        passes = self._passes_without(case, trigger, group.signature, recheck)
        return True if passes is None else passes

    def _passes_without(
        self, case: Case, trigger: tuple[str, ...], signature: Signature, recheck: Recheck
    ) -> bool | None:
        """Whether ``case`` with every feature of ``trigger`` reset no longer fails with
        ``signature`` (one recheck); ``None`` when the case model refuses the reset."""
        without = reset_all(case, trigger)
        if without is None:
            return None
        self.rechecks += 1
        return recheck(without, signature) is not True

    def jointly_explained(
        self, case: Case, signature: Signature, recheck: Recheck
    ) -> tuple[Group, Group] | None:
        """Two established groups of ``signature`` whose bugs together explain ``case``: it
        has both triggers, and resetting the features of both makes the failure go away
        (asked after neither alone explained it: with one trigger reset, the other bug
        still fails it). ``None`` when no pair does. Without this, a case with two known
        bugs' features would make a NEW group whose trigger is the two triggers joined."""
        matched = [
            g
            for g in self._established(signature)
            if g.key.trigger and matches(case, g.key.trigger)
        ]
        for i, first in enumerate(matched):
            for second in matched[i + 1 :]:
                both = tuple(dict.fromkeys((*first.key.trigger, *second.key.trigger)))
                if self._passes_without(case, both, signature, recheck):
                    return first, second
        return None

    def assign(self, member: Member, recheck: Recheck) -> Group:
        """Put a finding in its group (an established one, or its signature's unsorted
        pool); returns the group. A finding two established groups explain only together
        goes to the first of them (the one with the longer trigger), counted in its
        :attr:`Group.joint`."""
        signature = signature_of(member.result)
        group = self.explaining(member.case, signature, recheck)
        if group is not None:
            group.add(member)
            return group
        pair = self.jointly_explained(member.case, signature, recheck)
        if pair is not None:
            first, second = pair
            first.add(member)
            first.joint[second.name] += 1
            return first
        pool = self.unsorted(signature)
        if pool is None:
            pool = Group(signature=signature)
            self.groups.append(pool)
        pool.add(member)
        return pool

    def explaining(self, case: Case, signature: Signature, recheck: Recheck) -> Group | None:
        """The established group whose bug ``case``'s failure of ``signature`` is (tried
        longest trigger first), or ``None``: the group :meth:`assign` puts such a finding
        in, and the bug a shrink's candidate must not be (:meth:`accept_for`)."""
        return next(
            (g for g in self._established(signature) if self.explained_by(g, case, recheck)),
            None,
        )

    def accept_for(
        self, signature: Signature, recheck: Recheck
    ) -> Callable[[Case, PathResult], bool]:
        """The shrinker's extra test for a finding of ``signature`` still unsorted: a
        candidate another established group explains is that group's bug, not this one."""

        def accept(candidate: Case, verdict: PathResult) -> bool:
            return (
                self.explaining(candidate, signature, recheck) is None
                and self.jointly_explained(candidate, signature, recheck) is None
            )

        return accept

    def establish(self, pool: Group, trigger: Trigger, recheck: Recheck) -> Group:
        """The unsorted ``pool``'s representative has ``trigger``: make (or find) its group,
        move the pool's members it explains there, and return it. The rest stay unsorted."""
        key = GroupKey(signature=pool.signature, trigger=trigger.key)
        group = next((g for g in self.groups if g.established and g.key == key), None)
        if group is None:
            group = Group(signature=pool.signature, trigger=trigger)
            group.known = next(
                (
                    k
                    for k in self.known
                    if k.signature() == pool.signature and tuple(sorted(k.trigger)) == key.trigger
                ),
                None,
            )
            self.groups.insert(self.groups.index(pool), group)
        rep, *rest = pool.members
        group.add(rep)
        if group.minimal is None or (
            pool.minimal is not None and pool.minimal.size() < group.minimal.size()
        ):
            # a new group, or an existing one this pool's shrink beat: its minimal case
            group.minimal, group.minimal_result = pool.minimal, pool.minimal_result
            group.repro = pool.repro
        group.shrinks += pool.shrinks
        group.shrink_runs += pool.shrink_runs
        group.exhausted = pool.exhausted
        pool.members, pool.other_paths = [], Counter()
        pool.minimal = pool.minimal_result = pool.repro = None
        pool.shrinks = pool.shrink_runs = 0
        for member in rest:
            if self.explained_by(group, member.case, recheck):
                group.add(member)
            else:
                pool.add(member)
        if not pool.members:
            self.groups.remove(pool)
        return group

    def retrigger(self, group: Group, trigger: Trigger) -> Group:
        """An established group's trigger, found again on a smaller case: take it (its
        thresholds may be lower); if another group already has that key, merge into it."""
        key = GroupKey(signature=group.signature, trigger=trigger.key)
        if key == group.key:
            return group
        twin = next(
            (g for g in self.groups if g is not group and g.established and g.key == key), None
        )
        if twin is None:
            group.trigger = trigger
            return group
        for member in group.members:
            twin.add(member)
        if twin.minimal is None or (
            group.minimal is not None and group.minimal.size() < twin.minimal.size()
        ):
            twin.minimal, twin.minimal_result = group.minimal, group.minimal_result
        twin.shrinks += group.shrinks
        twin.shrink_runs += group.shrink_runs
        self.groups.remove(group)
        return twin

    def next_to_shrink(self, *, exploring: bool = False) -> Group | None:
        """The group whose representative should be shrunk next: unsorted pools first (each
        needs a shrink to become a group), then established groups with findings but no
        minimal case or a shrink the budget cut short (at most :data:`MAX_SHRINKS` each),
        fewest shrinks first, then the most findings.

        ``exploring``: while cases are still being drawn, a known bug that its corpus entry
        expects here waits: the entry holds its minimal repro, and shrinking it again would
        take the budget from finding what is not known (it is shrunk if the run ends with
        budget left). A known bug its entry does not expect here is shrunk like a new one."""
        waiting = [
            g
            for g in self.groups
            if g.members
            and not (exploring and g.known is not None and g.known.expectation == "still_fails")
            and (
                not g.established or g.minimal is None or (g.exhausted and g.shrinks < MAX_SHRINKS)
            )
        ]
        if not waiting:
            return None
        return min(waiting, key=lambda g: (g.established, g.shrinks, -len(g.members)))

    def live(self) -> list[Group]:
        """The groups with findings (what :meth:`records` lists), without their snapshots: a
        campaign's progress line counts them after every launch."""
        return [g for g in self.groups if g.members]

    def records(self, cases: int) -> list[GroupRecord]:
        """Every group with findings: NEW before KNOWN, then by count."""
        live = self.live()
        live.sort(key=lambda g: (g.known is not None, -len(g.members)))
        return [g.record(cases) for g in live]

    def triggers_to_avoid(self, paths: Collection[str] | None = None) -> list[tuple[str, ...]]:
        """The distinct non-empty triggers of established groups (known ones included) of
        ``paths`` (default: every path): a known bug of a path that does not run here is no
        reason to draw fewer cases with its features."""
        found = [
            g.key.trigger
            for g in self.groups
            if g.established and g.key.trigger and (paths is None or g.signature.path in paths)
        ]
        return list(dict.fromkeys(found))


def trigger_words(trigger: Sequence[str]) -> str:
    return describe(tuple(trigger))


def _resets(groups: Sequence[Group], case: Case) -> list[Case]:
    """``case`` with each of ``groups``' triggers reset, for the non-empty triggers it
    matches and the case model accepts reset (in ``groups``' order)."""
    wanted = []
    for group in groups:
        trigger = group.key.trigger
        if trigger and matches(case, trigger):
            without = reset_all(case, trigger)
            if without is not None:
                wanted.append(without)
    return wanted
