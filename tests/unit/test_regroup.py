"""Regrouping an earlier run's findings (:mod:`difftest.triage.regroup`), without a kernel:
the earlier groups keep their triggers, the corpus's known bugs take the findings they
explain, and a rerun (when the path can run) keeps a known bug from taking a finding that
only has its features."""

from __future__ import annotations

import dataclasses

from difftest.judgement.signature import Signature
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome, PathResult
from difftest.triage.groups import KnownBug, Member, Triage
from difftest.triage.regroup import EarlierGroup, Logged, regroup

BASE = Case(
    attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
    batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=3),
)
WRONG = PathResult(path="p", outcome=Outcome.WRONG, detail="tolerance", reason="off")
SIGNATURE = Signature(path="p", kind=Outcome.WRONG, detail="tolerance")
SINKS = KnownBug(
    name="sinks-bug",
    path="p",
    kind=Outcome.WRONG,
    detail="tolerance",
    trigger=("sinks",),
    expectation="still_fails",
)


def _finding(seed: int, *, sinks: bool = False, window: int = -1, was: str = "old") -> Logged:
    case = dataclasses.replace(
        BASE,
        seed=seed,
        attention=dataclasses.replace(BASE.attention, sinks=sinks, window_left=window),
    )
    return Logged(member=Member(case=case, result=WRONG, index=seed), was=was)


def test_known_bugs_take_the_findings_with_their_trigger_and_earlier_groups_keep_theirs() -> None:
    window = EarlierGroup(signature=SIGNATURE, trigger=("window",), id="p-wrong-window")
    logged = [
        _finding(1, sinks=True, was="p-wrong-unsorted"),
        _finding(2, sinks=True, was="p-wrong-unsorted"),
        _finding(3, window=3, was="p-wrong-window"),
        _finding(4, was="p-wrong-unsorted"),  # neither trigger: waits unsorted
    ]
    result = regroup(logged, [window], [SINKS], cases=10)
    by_known = {g.known: g for g in result.groups if g.established}
    assert by_known["sinks-bug"].count == 2
    assert by_known[None].trigger == ("window",) and by_known[None].count == 1
    assert result.unsorted == 1 and result.findings == 4
    assert result.rechecks == 0  # no rerun: assigned by trigger features
    assert result.moved[by_known["sinks-bug"].id] == {"p-wrong-unsorted": 2}


def test_a_rerun_keeps_a_known_bug_from_taking_a_finding_that_only_has_its_features() -> None:
    logged = [_finding(1, sinks=True), _finding(2, sinks=True)]

    def still_fails_without_sinks(case: Case, signature: Signature) -> bool | None:
        # seed 2 fails for another reason: resetting sinks does not make it pass
        return case.seed == 2

    static = regroup(logged, [], [SINKS], cases=2)
    assert [(g.known, g.count) for g in static.groups] == [("sinks-bug", 2)]
    checked = regroup(logged, [], [SINKS], cases=2, recheck=still_fails_without_sinks)
    assert checked.rechecks == 2
    counts = {(g.known, g.established): g.count for g in checked.groups}
    assert counts == {("sinks-bug", True): 1, (None, False): 1}


def test_a_groups_id_and_the_live_count_match_the_snapshots_they_stand_in_for() -> None:
    # a campaign names a finding's group, and counts the groups, once per finding and per
    # launch: with the snapshots (every member listed) that cost grew with the findings
    triage = Triage([SINKS])
    assert triage.live() == [] and triage.records(0) == []
    for seed, sinks in ((1, True), (2, False), (3, True)):
        member = _finding(seed, sinks=sinks).member
        group = triage.assign(member, lambda case, signature: None)
        assert group.id == group.record(seed).id
    records = triage.records(3)
    assert len(triage.live()) == len(records) == 2
    ids = {g.id for g in triage.groups if g.members}
    assert ids == {r.id for r in records}
    assert any(i.endswith("-unsorted") for i in ids) and not all(
        i.endswith("-unsorted") for i in ids
    )
