"""Which group a campaign shrinks next (:meth:`difftest.triage.groups.Triage.next_to_shrink`):
a known bug its corpus entry expects here waits while cases are drawn (the entry holds its
minimal repro); a known bug not expected here, and every new group, does not."""

from __future__ import annotations

from difftest.judgement.signature import Signature
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome, PathResult
from difftest.triage.groups import Group, KnownBug, Member, Triage
from difftest.triage.trigger import Trigger

CASE = Case(
    attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
    batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=3),
)


def _known(expectation: str | None) -> KnownBug:
    return KnownBug(
        name=f"bug-{expectation}",
        path="p",
        kind=Outcome.WRONG,
        detail="tolerance",
        trigger=("sinks",),
        expectation=expectation,
    )


def _member(index: int) -> Member:
    result = PathResult(path="p", outcome=Outcome.WRONG, detail="tolerance")
    return Member(case=CASE, result=result, index=index)


def test_an_expected_known_bug_waits_while_exploring_and_is_shrunk_at_the_end() -> None:
    triage = Triage(known=[_known("still_fails")])
    (known,) = triage.groups
    for i in range(5):
        known.members.append(_member(i))
    assert triage.next_to_shrink(exploring=True) is None
    assert triage.next_to_shrink() is known  # what is left of the budget at the end


def test_a_new_group_is_shrunk_while_exploring_even_beside_a_larger_known_one() -> None:
    triage = Triage(known=[_known("still_fails")])
    for i in range(50):
        triage.groups[0].members.append(_member(i))
    new = Group(
        signature=Signature(path="p", kind=Outcome.WRONG, detail="tolerance"),
        trigger=Trigger(labels=("window",)),
    )
    new.members.append(_member(99))
    triage.groups.append(new)
    assert triage.next_to_shrink(exploring=True) is new


def test_a_known_bug_not_expected_here_is_shrunk_like_a_new_one() -> None:
    for expectation in ("fixed", None):  # a regression, or a version its entry never saw
        triage = Triage(known=[_known(expectation)])
        (known,) = triage.groups
        known.members.append(_member(0))
        assert triage.next_to_shrink(exploring=True) is known
