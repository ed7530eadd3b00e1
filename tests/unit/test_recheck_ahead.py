"""Triage's rechecks of one launch's findings run together (``Keeper.recheck_ahead``, through
:meth:`Session.still_fail`): in packed launches, judged as a campaign judges a launch. The
groups, their members and every answer are the same as one recheck at a time gives; the
rechecks take fewer launches. And the variants a finding would be rechecked on (its case with
a trigger reset, ``Triage.resets_of``) are those of the bugs that may fail here: what
compile-ahead builds behind the case's own. On the CPU, with the planted ``bmm2_scale`` bug
known."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from types import ModuleType

import pytest
from _planted import PLANTED_FILE, cpu_session, one_torch_thread, planted_fixture  # noqa: F401

from difftest.campaign import keeping
from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.campaign.report import CampaignReport
from difftest.execution.session import Session
from difftest.judgement.signature import Signature
from difftest.model.outcome import Outcome
from difftest.triage.features import reset_all
from difftest.triage.groups import KnownBug, Triage

BMM2 = "planted-bmm2"
KNOWN = KnownBug(
    name="planted-bmm2-scale",
    path=BMM2,
    kind=Outcome.WRONG,
    detail="tolerance",
    trigger=("bmm2_scale",),
    expectation="still_fails",
)


def _campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: bool
) -> tuple[CampaignReport, int]:
    launches: list[int] = []
    real = Session._recheck_launch

    def counted(self: Session, cases, check_determinism, *, path):  # type: ignore[no-untyped-def]
        launches.append(len(cases))
        return real(self, cases, check_determinism, path=path)

    monkeypatch.setattr(Session, "_recheck_launch", counted)
    if not ahead:
        monkeypatch.setattr(keeping.Keeper, "recheck_ahead", lambda self, judged: None)
    config = CampaignConfig(
        seed=3,
        pack=4,
        max_cases=64,
        out_dir=tmp_path,
        known=(KNOWN,),
        avoid=False,
        shrink=False,
        determinism_every=0,
    )
    with cpu_session((BMM2,)) as session:
        report = run_campaign(config, session)
    monkeypatch.undo()
    return report, len(launches)


def _groups(report: CampaignReport) -> list[tuple[str, str | None, int, tuple[str, ...]]]:
    return sorted((g.id, g.known, g.count, g.digests) for g in report.groups)


def test_rechecks_run_ahead_give_the_same_groups_in_fewer_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: ModuleType
) -> None:
    ahead, ahead_launches = _campaign(tmp_path / "ahead", monkeypatch, ahead=True)
    alone, alone_launches = _campaign(tmp_path / "alone", monkeypatch, ahead=False)
    known = [g for g in ahead.groups if g.known == KNOWN.name]
    assert known and known[0].count >= 8, "too few findings of the known bug to compare"
    assert _groups(ahead) == _groups(alone)
    assert ahead.cases == alone.cases and len(ahead.findings) == len(alone.findings)
    assert alone_launches >= known[0].count  # one recheck launch a finding, at least
    assert ahead_launches < alone_launches / 2


def test_still_fail_answers_as_still_fails_does_one_at_a_time(planted: ModuleType) -> None:
    signature = Signature(path=BMM2, kind=Outcome.WRONG, detail="tolerance")
    config = CampaignConfig(seed=5, pack=4)
    cases = [c for _, c in itertools.islice(planned_cases(config, "cpu"), 40)]
    scaled = [c for c in cases if c.attention.v_scale != c.attention.o_scale]
    reset = [r for c in scaled if (r := reset_all(c, ("bmm2_scale",))) is not None]
    items = [(c, signature) for c in scaled + reset]
    assert scaled and reset
    with cpu_session((BMM2,)) as session:
        together = session.still_fail(items, pack=4)
        one_by_one = [session.still_fails(c, s) for c, s in items]
    assert together == one_by_one
    assert True in together and False in together  # the bug fails some, its reset passes


def test_the_variants_a_finding_would_be_rechecked_on_are_those_of_bugs_that_may_fire_here() -> (
    None
):
    other_path = dataclasses.replace(KNOWN, name="elsewhere", path="another-path")
    fixed = dataclasses.replace(KNOWN, name="fixed-here", trigger=("sinks",), expectation="fixed")
    unknown = dataclasses.replace(KNOWN, name="unchecked", trigger=("window",), expectation=None)
    triage = Triage(known=[KNOWN, other_path, fixed, unknown])
    base = next(
        c
        for _, c in planned_cases(CampaignConfig(seed=5), "cpu")
        if c.attention.v_scale != c.attention.o_scale
    )
    case = base.replace(attention=dataclasses.replace(base.attention, sinks=True, window_left=3))
    resets = triage.resets_of(case, {BMM2})
    # bmm2_scale reset (KNOWN) and the window reset (no expectation: may fire); not the
    # fixed bug's sinks reset, nor the bug of a path not run
    assert len(resets) == 2
    assert resets[0] == reset_all(case, ("bmm2_scale",))
    assert resets[1] == reset_all(case, ("window",))
    assert triage.resets_of(case, set()) == []
    plain = reset_all(reset_all(case, ("bmm2_scale",)), ("window",))  # type: ignore[arg-type]
    assert plain is not None and triage.resets_of(plain, {BMM2}) == []


def test_a_recheck_that_runs_a_compile_variant_first_counts_its_kernels_as_compile(
    planted: ModuleType,
) -> None:
    """A recheck can be the first run of a compile variant (a reset trigger may need another
    module): on a GPU its kernel time is then a module's build or load, which a campaign counts
    as compile, as it counts a first launch's (``Session.recheck_compile_s``), not as
    triage."""
    signature = Signature(path=BMM2, kind=Outcome.WRONG, detail="tolerance")
    cases = [c for _, c in itertools.islice(planned_cases(CampaignConfig(seed=5), "cpu"), 60)]
    first = cases[0]
    same = first.replace(seed=first.seed + 1)  # other values, the same compile variant
    assert same.compile_variant() == first.compile_variant()
    other = next(c for c in cases if c.compile_variant() != first.compile_variant())
    with cpu_session((BMM2,)) as session:
        session.evaluate_launch([first])
        session.still_fails(same, signature)
        assert session.recheck_compile_s == 0.0  # its variant had run: nothing to build
        session.still_fails(other, signature)
        compiled = session.recheck_compile_s
        assert compiled > 0.0  # the other variant's first run: its kernel time
        session.still_fails(other, signature)
        assert session.recheck_compile_s == compiled  # run once already


def test_a_campaign_counts_a_recheck_s_compile_apart_from_triage() -> None:
    from collections import defaultdict
    from types import SimpleNamespace

    run = SimpleNamespace(
        session=SimpleNamespace(recheck_compile_s=5.0),
        tally=SimpleNamespace(timings=defaultdict(float)),
    )
    run.session.recheck_compile_s = 7.5  # this recheck's first runs: 2.5 s of kernels
    keeping.Keeper._rechecked_for(run, 3.0, 5.0)  # type: ignore[arg-type]
    assert run.tally.timings == {"compile": 2.5, "triage": 0.5}


def test_rechecks_through_a_worker_rerun_alone_in_the_launchs_message(
    planted: ModuleType,
) -> None:
    """Through an isolated worker, a recheck launch is one message, its reruns alone included
    (``judge_pack``), where it was one message more a rerun; the answers are the same as one
    recheck at a time gives."""
    signature = Signature(path=BMM2, kind=Outcome.WRONG, detail="tolerance")
    cases = [
        c for _, c in itertools.islice(planned_cases(CampaignConfig(seed=5, pack=4), "cpu"), 40)
    ]
    scaled = [c for c in cases if c.attention.v_scale != c.attention.o_scale][:6]
    reset = [r for c in scaled if (r := reset_all(c, ("bmm2_scale",))) is not None][:2]
    items = [(c, signature) for c in scaled + reset]
    assert len(scaled) >= 4 and reset
    with cpu_session((BMM2,), plugins=(str(PLANTED_FILE),), isolation="process") as session:
        executor = session.executor()
        session.evaluate_launch([scaled[0]])  # the worker started and warm
        before = executor.messages  # type: ignore[attr-defined]
        together = session.still_fail(items, pack=4)
        messages = executor.messages - before  # type: ignore[attr-defined]
        one_by_one = [session.still_fails(c, s) for c, s in items]
    assert together == one_by_one
    failing = together.count(True)
    assert failing >= 3 and False in together  # reruns alone were needed, and a reset passes
    launches = -(-len(items) // 4)
    # one message a launch: no more than the launches (a launch that cannot pack splits)
    assert messages <= launches + 1 < launches + failing
