"""A launch is one message to its isolated worker, reruns alone included
(``IsolatedExecutor.judge_pack``, ``rerun_alone`` in the worker), and the next launch is
written behind the running one (``LaunchPool``, and the sequential loop's
``Session.write_ahead``): the worker goes from one launch to the next without waiting for its
parent. None of it may change a verdict: each launch is judged as the parent judges it when it
sends the launch and each rerun as messages of their own."""

from __future__ import annotations

import dataclasses
import runpy
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from _planted import cpu_session, one_torch_thread  # noqa: F401  (autouse: one torch thread)
from test_packing import launches
from test_parallel_launches import _FakeExecutor

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig
from difftest.execution.executors import InProcessExecutor
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.execution.launches import Judged, judge_launch, launch_results
from difftest.execution.parallel import BackgroundLaunch, LaunchPool, run_launch
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Outcome
from difftest.paths import all_paths, resolve, unregister

ROOT = Path(__file__).resolve().parents[2]
SLOTS_PLUGIN = str(ROOT / "tests" / "fixtures" / "launch_slots.py")
WRONG_PLUGIN = str(ROOT / "tests" / "fixtures" / "wrong_path.py")
ABORT_PLUGIN = str(ROOT / "tests" / "fixtures" / "slots_abort_alone.py")
SLOW_PLUGIN = str(ROOT / "tests" / "fixtures" / "slow_path.py")
FINDING_PATHS = ["torch-sdpa", "wrong-long-prefix", "launch-slots-8"]


@pytest.fixture(name="plugin_paths")
def plugin_paths_fixture() -> Iterator[None]:
    """The fixture plugins' paths, registered in this process for one test."""
    before = {p.name for p in all_paths()}
    for plugin in (SLOTS_PLUGIN, WRONG_PLUGIN, ABORT_PLUGIN, SLOW_PLUGIN):
        runpy.run_path(plugin)
    yield
    for path in all_paths():
        if path.name not in before:
            unregister(path.name)


def _verdicts(judged: Sequence[Judged]) -> list[object]:
    """What a launch's judgement says of each case: its verdict's digest, outcomes, reasons and
    metrics per path (but the log tail of a worker that crashed: its stack differs), and its
    packed-only findings."""
    return [
        (
            j.case.digest(),
            j.result.case_digest,
            [
                (r.path, r.outcome, r.reason, dataclasses.replace(r.metrics, worker_output=()))
                for r in j.result.results
            ],
            [(r.path, r.outcome, r.reason) for r in j.packed_only],
        )
        for j in judged
    ]


def _rerun(judged: Sequence[Judged]) -> int:
    """Cases whose verdict is their verdict alone (rerun: their launch found something)."""
    return sum(1 for j in judged if j.result.findings() or j.packed_only)


def test_a_launch_and_its_reruns_alone_are_one_message_judged_as_the_parent_judges_them(
    plugin_paths: None,
) -> None:
    groups = launches(6, size=4, seed=2)
    paths = resolve(FINDING_PATHS)
    names = [p.name for p in paths]
    reference = InProcessExecutor(paths, torch.device("cpu"))
    with IsolatedExecutor(paths, "cpu", plugins=[SLOTS_PLUGIN, WRONG_PLUGIN]) as executor:
        got = [run_launch(executor, cases, False, names) for cases in groups]
        assert executor.messages == len(groups)  # reruns included
        assert executor.replacements == 0
    want = [run_launch(reference, cases, False, names) for cases in groups]
    assert [_verdicts(r.judged) for r in got] == [_verdicts(r.judged) for r in want]
    judged = [j for r in got for j in r.judged]
    assert _rerun(judged) >= 2, "no case of these launches was rerun alone"
    assert any(j.packed_only for j in judged), "no packed-only finding: the launches are too small"
    assert any(j.result.findings() for j in judged), "no finding alone"
    # every verdict the launch produced, in the order judging asked for them: the launch's,
    # then each rerun's (the session accounts for them so)
    for ran, ref in zip(got, want, strict=True):
        assert [r.case_digest for r in ran.results] == [r.case_digest for r in ref.results]
        assert {id(j.result) for j in ran.judged} <= {id(r) for r in ran.results}


def test_a_crash_in_a_rerun_alone_gives_the_verdicts_of_reruns_sent_one_by_one(
    plugin_paths: None,
) -> None:
    """The worker dies in a rerun alone, after the launch gave its verdicts: every case gets
    the verdict the parent gives when it sends the launch and each rerun itself (a case of at
    most 8 requests past the launch's eighth crashes alone; a larger one is wrong alone)."""
    groups = [
        g
        for g in launches(8, size=4, seed=2)
        if any(c.batch.num_requests <= 8 for c in g[1:]) and g[0].batch.num_requests > 8
    ]
    assert groups, "no launch with a small case past its eighth request"
    cases = groups[0]
    paths = resolve(["torch-sdpa", "slots-8-abort-alone"])
    names = [p.name for p in paths]
    deadline = Deadline(base_s=20.0, cold_s=0.0, grace_s=0.5)
    with IsolatedExecutor(paths, "cpu", plugins=[ABORT_PLUGIN], deadline=deadline) as executor:
        got = run_launch(executor, cases, False, names).judged
        assert executor.replacements >= 1
    with IsolatedExecutor(paths, "cpu", plugins=[ABORT_PLUGIN], deadline=deadline) as executor:

        def one_by_one(launch: Sequence[Case], check: bool) -> list[CaseResult]:
            return launch_results(executor, launch, check, names)

        want = judge_launch(one_by_one, cases)
    assert _verdicts(got) == _verdicts(want)
    outcomes = [j.result.result_for("slots-8-abort-alone") for j in got]
    assert Outcome.CRASH in {o.outcome for o in outcomes if o is not None}
    assert Outcome.CRASH not in {o.outcome for o in outcomes[:1] if o is not None}


class _Writer(_FakeExecutor):
    """An executor stand-in whose cases wait for ``gate``, whose launches run in a thread
    (``runs_elsewhere``), and which notes what is written ahead of them."""

    runs_elsewhere = True

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.ahead: list[list[str]] = []

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        assert self.gate.wait(30)
        return CaseResult(case_digest=case.digest(), results=())

    def send_ahead(self, cases: Sequence[Case], **options: object) -> bool:
        self.ahead.append([c.digest() for c in cases])
        return True


class _PackWriter(_Writer):
    """One that reruns a launch's cases alone in its worker: a launch is one message."""

    def judge_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[tuple[CaseResult, CaseResult | None]]:
        return [(r, None) for r in self.evaluate_pack(cases)]


def _first(count: int) -> list[Case]:
    return [c for group in launches(count, size=2, seed=3) for c in group][:count]


def test_the_pool_writes_a_launch_behind_a_launch_of_several_cases_of_one_message() -> None:
    a, b, c, d = _first(4)
    gate = threading.Event()
    executor = _PackWriter(gate)
    pool = LaunchPool([executor])  # type: ignore[list-item]
    first = pool.submit([a, b], False, ["p"])
    while not pool.running:
        threading.Event().wait(0.01)
    second = pool.submit([c], False, ["p"])
    third = pool.submit([d, a], False, ["p"])
    # behind launches of one message each: both written, in order
    assert executor.ahead == [[c.digest()], [d.digest(), a.digest()]]
    gate.set()
    for launch, cases in ((first, [a, b]), (second, [c]), (third, [d, a])):
        assert [j.case for j in launch.result(timeout=60).judged] == cases
    pool.close()


def test_the_sequential_loop_writes_only_behind_a_running_launch_of_its_executor() -> None:
    a, b, c, d = _first(4)
    gate = threading.Event()
    background = BackgroundLaunch()
    executor, other = _PackWriter(gate), _PackWriter(gate)
    plain = _Writer(gate)
    assert not background.write_ahead(executor, [a], False, ["p"])  # nothing runs
    running: Future[object] = background.start(executor, [a, b], False, ["p"])  # type: ignore[arg-type,assignment]
    assert not background.write_ahead(other, [c], False, ["p"])  # another executor
    assert not background.write_ahead(executor, [c], False, [])  # no path to run
    assert background.write_ahead(executor, [c, d], False, ["p"])
    assert executor.ahead == [[c.digest(), d.digest()]] and other.ahead == []
    gate.set()
    running.result(timeout=60)
    assert not background.write_ahead(executor, [c], False, ["p"])  # it has ended
    gate.clear()
    # behind a launch of several cases whose reruns the parent sends: nothing
    background.start(plain, [a, b], False, ["p"])  # type: ignore[arg-type]
    assert not background.write_ahead(plain, [c], False, ["p"]) and plain.ahead == []
    gate.set()
    background.drain()


def test_an_isolated_sequential_campaign_runs_launches_written_ahead_with_the_same_verdicts(
    tmp_path: Path, plugin_paths: None
) -> None:
    """Each launch takes a quarter of a second (``slow-sdpa``): it surely runs while the
    parent accounts for the one before it and draws the next, which the parent then writes
    behind it; the worker runs those as written. (A launch with a finding is rechecked by
    triage on the same executor, which first waits for the launch running: nothing is
    written behind the next one. The planted path finds nothing here for that reason.)"""

    def run(isolation: str) -> tuple[object, int]:
        config = CampaignConfig(
            seed=2, pack=4, max_cases=24, out_dir=tmp_path / isolation, workers=1, avoid=False
        )
        with cpu_session(
            ("slow-sdpa", "torch-sdpa"), isolation=isolation, plugins=(SLOW_PLUGIN,)
        ) as session:
            report = run_campaign(config, session)
            executor = session.executor()
            taken = getattr(executor, "taken_ahead", 0)
        return (
            report.cases,
            report.case_digest,
            {n: s.outcomes for n, s in report.paths.items()},
            sorted((f.case_digest, f.path, f.kind, f.packed_only) for f in report.findings),
        ), taken

    (isolated, taken), (in_process, _) = run("process"), run("none")
    assert isolated == in_process
    assert isolated[0] == 24 and not isolated[3]
    assert taken >= 3, "launches were not written ahead"  # of the 5 that have one before
