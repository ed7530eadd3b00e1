"""A finding two known bugs explain only together (:meth:`Triage.jointly_explained`): it
joins the first of them, counted as joint, instead of making a NEW group whose trigger is the
two triggers joined (as FlashInfer 0.6.16.post4's XQA did on its own test's shape, with
``bmm2_scale != 1`` and SGLang's longer draft length in one case). Without a kernel: the
recheck is a model of a path with both bugs."""

from __future__ import annotations

import dataclasses

from difftest.judgement.signature import Signature
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome, PathResult
from difftest.triage.groups import KnownBug, Member, Triage

BASE = Case(
    attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
    batch=BatchSpec(mode="target_verify", prefix_lens=(9, 12), q_len=3),
)
SIGNATURE = Signature(path="p", kind=Outcome.WRONG, detail="tolerance")
SINKS = KnownBug(
    name="sinks-bug", path="p", kind=Outcome.WRONG, detail="tolerance", trigger=("sinks",)
)
WINDOW = KnownBug(
    name="window-bug", path="p", kind=Outcome.WRONG, detail="tolerance", trigger=("window",)
)


def _case(*, sinks: bool = False, window: int = -1, seed: int = 0) -> Case:
    attention = dataclasses.replace(BASE.attention, sinks=sinks, window_left=window)
    return dataclasses.replace(BASE, attention=attention, seed=seed)


def _member(case: Case) -> Member:
    result = PathResult(path="p", outcome=Outcome.WRONG, detail="tolerance")
    return Member(case=case, result=result, index=1)


def both_bugs(case: Case, signature: Signature) -> bool:
    """A path with both bugs: any case with sinks, or with a window, fails."""
    return case.attention.sinks or case.attention.window_left >= 0


def test_a_case_with_both_known_bugs_joins_one_of_them_as_joint() -> None:
    triage = Triage(known=[SINKS, WINDOW])
    group = triage.assign(_member(_case(sinks=True, window=2)), both_bugs)
    assert group.known in (SINKS, WINDOW)
    other = WINDOW if group.known is SINKS else SINKS
    assert dict(group.joint) == {other.name: 1}
    assert all(g.established for g in triage.groups)  # no unsorted pool: nothing NEW
    record = group.record(cases=1)
    assert record.joint == {other.name: 1}
    assert any(f"fail through {other.name} too" in line for line in record.lines())


def test_a_case_one_bug_explains_is_not_joint() -> None:
    triage = Triage(known=[SINKS, WINDOW])
    group = triage.assign(_member(_case(sinks=True)), both_bugs)
    assert group.known is SINKS and not group.joint


def test_a_case_that_fails_with_both_triggers_reset_is_a_third_bug() -> None:
    triage = Triage(known=[SINKS, WINDOW])
    group = triage.assign(_member(_case(sinks=True, window=2)), lambda case, sig: True)
    assert not group.established and group.known is None  # unsorted: waits for its shrink


def test_the_shrinker_refuses_a_candidate_two_bugs_explain_together() -> None:
    triage = Triage(known=[SINKS, WINDOW])
    accept = triage.accept_for(SIGNATURE, both_bugs)
    verdict = PathResult(path="p", outcome=Outcome.WRONG, detail="tolerance")
    assert not accept(_case(sinks=True, window=2), verdict)
    assert accept(_case(), verdict)  # neither trigger: another bug's candidate


def test_joint_counts_survive_the_groups_json_round_trip() -> None:
    from difftest.triage.groups import GroupRecord

    triage = Triage(known=[SINKS, WINDOW])
    group = triage.assign(_member(_case(sinks=True, window=2)), both_bugs)
    record = group.record(cases=3)
    assert GroupRecord.from_json(record.to_json(), "test").joint == record.joint
