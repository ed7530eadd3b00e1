"""The mutant kernels: each shows its bug on its minimal case and nowhere it claims not to.

For every mutant: its hand-derived minimal case is detected (with the outcome its bug should
produce), every case one step smaller is not (so the minimal size the self-test holds the
shrinker to is right), and its harmless case agrees with the oracle (so the bug sits behind the
trigger it names). The seams the mutants are built from compute exactly what
``torch-paged-online`` computes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings

from difftest.calibration.mutants import MUTANT_TAG, MUTANTS, Mutant, get_mutant
from difftest.calibration.mutants.kernel import attend
from difftest.calibration.mutants.mutant import MIN_HEAD_DIM
from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.generation.strategies import Limits, cases
from difftest.model.case import Case, TreeDraft
from difftest.model.errors import DifftestError, InvalidCase
from difftest.model.outcome import Outcome
from difftest.paths import get_path, resolve
from difftest.paths.torch_online import stream, unpack

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = [m for m in MUTANTS if not m.isolated]
ISOLATED = [m for m in MUTANTS if m.isolated]


def ids(mutants: Sequence[Mutant]) -> list[str]:
    return [m.name for m in mutants]


def verdict(mutant: Mutant, case: Case) -> Outcome:
    result = evaluate(case, [mutant.path()], check_determinism=True).results[0]
    return result.outcome


# -- the catalogue --------------------------------------------------------------------------


def test_mutants_are_registered_but_left_out_of_ordinary_campaigns() -> None:
    names = {m.name for m in MUTANTS}
    assert len(names) == len(MUTANTS)
    for mutant in MUTANTS:
        path = get_path(mutant.name)
        assert MUTANT_TAG in path.tags
        assert path.description.startswith("MUTANT")
    assert not names & {p.name for p in resolve(None)}
    assert {"torch-sdpa", "torch-paged-online"} <= {p.name for p in resolve(None)}


def test_at_least_fourteen_distinct_bug_classes() -> None:
    assert len({m.bug_class for m in MUTANTS}) >= 14
    assert {m.isolated for m in MUTANTS} == {True, False}
    kinds = set().union(*(m.detected_as for m in MUTANTS))
    assert {Outcome.WRONG, Outcome.RAISED, Outcome.NONDETERMINISTIC, Outcome.CRASH} <= kinds
    assert Outcome.HANG in kinds


def test_get_mutant_names_the_known_ones() -> None:
    assert get_mutant("mutant-gqa-modulo").bug_class == "GQA head mapping"
    with pytest.raises(DifftestError, match="mutant-gqa-modulo"):
        get_mutant("mutant-nope")


def test_a_mutant_must_be_named_and_detectable() -> None:
    base = MUTANTS[0]
    with pytest.raises(ValueError, match="must start with 'mutant-'"):
        dataclasses.replace(base, name="gqa")
    with pytest.raises(ValueError, match="detected_as"):
        dataclasses.replace(base, detected_as=frozenset({Outcome.AGREE}))


@settings(max_examples=15)
@given(cases(limits=Limits(max_requests=3, max_prefix=80, max_work=300_000)))
def test_the_unmutated_seams_compute_what_torch_paged_online_computes(case: Case) -> None:
    batch = materialize(case)
    x = unpack(batch)
    ps = case.attention.page_size
    assert torch.equal(attend(x, ps), stream(x, ps))


# -- each mutant: minimal case, one step smaller, harmless case ------------------------------


@pytest.mark.parametrize("mutant", IN_PROCESS, ids=ids(IN_PROCESS))
def test_the_minimal_case_shows_the_bug(mutant: Mutant) -> None:
    assert verdict(mutant, mutant.minimal) in mutant.detected_as


@pytest.mark.parametrize("mutant", MUTANTS, ids=ids(MUTANTS))
def test_the_harmless_case_agrees(mutant: Mutant) -> None:
    assert verdict(mutant, mutant.harmless) is Outcome.AGREE


@pytest.mark.parametrize("mutant", MUTANTS, ids=ids(MUTANTS))
def test_no_case_one_step_smaller_shows_the_bug(mutant: Mutant) -> None:
    minimal = mutant.minimal
    assert minimal.attention.head_dim == MIN_HEAD_DIM
    neighbours = smaller_neighbours(minimal)
    assert all(c.size() < minimal.size() for c in neighbours)
    for case in neighbours:
        assert verdict(mutant, case) not in mutant.detected_as, case.to_json()


def smaller_neighbours(case: Case) -> list[Case]:
    """Valid cases one step smaller along every dimension :meth:`Case.size` counts: a request
    fewer, a prefix one shorter, a padding request fewer, ``L`` one less (a tree draft loses
    its last token, or any one token), a query head per group fewer, a KV head fewer."""
    a, b = case.attention, case.batch
    makers: list[Callable[[], Case]] = []

    def batch(**changes: Any) -> Callable[[], Case]:
        return lambda: case.replace(batch=dataclasses.replace(b, **changes))

    def attention(**changes: Any) -> Callable[[], Case]:
        return lambda: case.replace(attention=dataclasses.replace(a, **changes))

    lens = b.prefix_lens
    for i in range(len(lens)):
        if len(lens) > 1:
            makers.append(batch(prefix_lens=lens[:i] + lens[i + 1 :]))
        if lens[i] > 0:
            makers.append(batch(prefix_lens=(*lens[:i], lens[i] - 1, *lens[i + 1 :])))
    if b.padding_requests:
        makers.append(batch(padding_requests=b.padding_requests - 1))
    if b.q_len > 1:
        if isinstance(b.draft, TreeDraft):
            for k in range(1, b.q_len):
                makers.append(batch(q_len=b.q_len - 1, draft=_drop_token(b.draft, k)))
        else:
            makers.append(batch(q_len=b.q_len - 1))
    if a.group_size > 1:
        makers.append(attention(num_qo_heads=a.num_qo_heads - a.num_kv_heads))
    if a.num_kv_heads > 1:
        fewer = a.num_kv_heads - 1
        makers.append(attention(num_kv_heads=fewer, num_qo_heads=fewer * a.group_size))
    out = []
    for make in makers:
        try:
            out.append(make())
        except InvalidCase:
            pass
    return out


def _drop_token(draft: TreeDraft, k: int) -> TreeDraft:
    """The tree without token ``k``: its children hang from its parent."""
    parents = []
    for i, p in enumerate(draft.parents):
        if i != k:
            p = draft.parents[k] if p == k else p
            parents.append(p - 1 if p > k else p)
    return TreeDraft(parents=tuple(parents))


def test_neighbours_cover_every_size_dimension() -> None:
    case = get_mutant("mutant-draft-mask-ignored").minimal
    case = case.replace(
        batch=dataclasses.replace(case.batch, prefix_lens=(2, 1), padding_requests=1),
        attention=dataclasses.replace(case.attention, num_qo_heads=4, num_kv_heads=2),
    )
    shapes = {
        (c.batch.prefix_lens, c.batch.padding_requests, c.batch.q_len, c.attention.num_qo_heads)
        for c in smaller_neighbours(case)
    }
    assert shapes == {
        ((1,), 1, 3, 4),
        ((2,), 1, 3, 4),
        ((1, 1), 1, 3, 4),
        ((2, 0), 1, 3, 4),
        ((2, 1), 0, 3, 4),
        ((2, 1), 1, 2, 4),
        ((2, 1), 1, 3, 2),
    }
    assert [d.batch.draft for d in smaller_neighbours(case) if d.batch.q_len == 2] == [
        TreeDraft(parents=(-1, 0)),
        TreeDraft(parents=(-1, 0)),
    ]


# -- the mutants that take the process with them ---------------------------------------------

_PROBE = """
import sys, threading
from difftest.generation.materialize import materialize
from difftest.calibration.mutants import get_mutant
mutant = get_mutant(sys.argv[1])
batch = materialize(mutant.minimal)
worker = threading.Thread(target=mutant.run, args=(batch,), daemon=True)
worker.start()
worker.join(float(sys.argv[2]))
print("still running" if worker.is_alive() else "returned", flush=True)
"""


def probe(name: str, wait_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _PROBE, name, str(wait_s)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_the_crash_mutant_aborts_the_process_on_its_minimal_case() -> None:
    done = probe("mutant-crash-long-table", 30.0)
    assert done.returncode == -signal.SIGABRT, done.stderr
    assert "returned" not in done.stdout


def test_the_hang_mutant_never_returns_on_its_minimal_case() -> None:
    done = probe("mutant-hang-large-group", 2.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"


def test_a_selftest_campaign_stops_on_new_shrunk_groups_only() -> None:
    """The self-test's stop rule: an established, shrunk group of the wanted kind counts, a
    known bug's group never does (with it counted, the pair campaign "second bug with the
    first known" stopped once the known one was shrunk, before the second came up)."""
    from difftest.calibration.selftest import found_enough
    from difftest.judgement.signature import Signature
    from difftest.model.outcome import Outcome, PathResult
    from difftest.triage.groups import Group, KnownBug, Member, Triage
    from difftest.triage.trigger import Trigger

    case = get_mutant("mutant-row-stride").minimal
    member = Member(case=case, result=PathResult(path="m", outcome=Outcome.WRONG), index=1)
    known = KnownBug(name="first", path="m", kind=Outcome.WRONG, trigger=("L>2",))
    triage = Triage(known=[known])
    triage.groups[0].members.append(member)
    triage.groups[0].minimal = case
    wrong = frozenset({Outcome.WRONG})
    assert not found_enough(triage, 1, wrong)  # only the known bug's group, shrunk
    new = Group(
        signature=Signature(path="m", kind=Outcome.WRONG), trigger=Trigger(labels=("prefix>4",))
    )
    new.members.append(member)
    triage.groups.append(new)
    assert not found_enough(triage, 1, wrong)  # the new one is not shrunk yet
    new.minimal = case
    assert found_enough(triage, 1, wrong)
    assert not found_enough(triage, 1, frozenset({Outcome.CRASH}))  # not a wanted kind
    assert not found_enough(triage, 2, wrong)


def test_a_selftest_campaign_draws_the_cases_per_template_its_budget_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``difftest selftest --cases-per-variant N`` (how a change of a CPU run's drawing
    default is measured first): the budget's count reaches every campaign's config, and the
    report's JSON says what ran."""
    from difftest.calibration import selftest
    from difftest.campaign.planning import CampaignConfig

    seen: list[CampaignConfig] = []
    real = selftest.run_campaign

    def spy(config: CampaignConfig, *args: Any, **kwargs: Any) -> Any:
        seen.append(config)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(selftest, "run_campaign", spy)
    budget = selftest.Budget(max_cases=8, shrink_runs=20, cases_per_variant=4, pack=2)
    report = selftest.measure(
        get_mutant("mutant-causal-off-by-one"),
        budget=budget,
        seed=0,
        out_dir=tmp_path,
        device=torch.device("cpu"),
    )
    assert report.detected
    assert [(c.cases_per_variant, c.pack) for c in seen] == [(4, 2)]
    assert selftest.Budget().cases_per_variant == selftest.Budget().pack == 1  # a CPU run's
    whole = selftest.SelftestReport(results=(report,), pairs=(), budget=budget, seed=0, wall_s=0.0)
    assert whole.to_json()["budget"]["cases_per_variant"] == 4
    assert whole.to_json()["budget"]["pack"] == 2
