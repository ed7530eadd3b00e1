"""Launches running at once (``CampaignConfig.workers``, ``LaunchPool``): the same verdicts,
findings and case list as one launch at a time, judged in the order started."""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from _planted import campaign, cpu_session, one_torch_thread  # noqa: F401  (autouse)

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.campaign.pooled import _drop, _Running
from difftest.campaign.report import CampaignReport
from difftest.execution.executors import BudgetSpent
from difftest.execution.isolation import IsolatedExecutor, WorkerError
from difftest.execution.parallel import LANE_DEPTH, LaunchPool, Ran, run_launch
from difftest.interfaces.commands._campaign_options import campaign_config, default_workers
from difftest.machine.cores import CPU_WORKERS_MAX, usable_cores
from difftest.model.case import Case
from difftest.model.errors import DifftestError
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths import resolve
from difftest.records.run_dir import RunDirectory

ROOT = Path(__file__).resolve().parents[2]
WRONG_PLUGIN = str(ROOT / "tests" / "fixtures" / "wrong_path.py")
CPU_PATHS = ("torch-sdpa", "torch-paged-online")


def first_cases(count: int, seed: int = 0) -> list[Case]:
    return [c for _, c in itertools.islice(planned_cases(CampaignConfig(seed=seed), "cpu"), count)]


class _FakeExecutor:
    """What every fake executor here shares: no paths, a CPU, no budget, each case of a pack
    evaluated alone; subclasses say how a case is evaluated."""

    def __init__(self) -> None:
        self.paths: Sequence[object] = ()
        self.device = torch.device("cpu")
        self.stop_at: float | None = None
        self.closed = False

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        raise NotImplementedError

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        return [self.evaluate(c) for c in cases]

    def spawn_early(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class _Meeting(_FakeExecutor):
    """An executor whose every case waits at ``barrier`` (for the other cases running)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        self.barrier.wait(timeout=30)  # BrokenBarrierError unless the other launch runs too
        return _verdict(case, Outcome.AGREE)


def test_the_pool_runs_its_launches_at_once_and_owns_its_executors() -> None:
    barrier = threading.Barrier(3)  # the two launches and this test
    executors = [_Meeting(barrier), _Meeting(barrier)]
    pool = LaunchPool(executors)  # type: ignore[arg-type]
    a, b = first_cases(2)
    first = pool.submit([a], False, ["p"])
    second = pool.submit([b], False, ["p"])
    barrier.wait(timeout=30)  # both launches reached it: they ran at once
    assert [j.case for j in first.result(timeout=60).judged] == [a]
    assert [j.case for j in second.result(timeout=60).judged] == [b]
    assert pool.running == pool.unfinished == 0
    pool.close()
    assert all(e.closed for e in executors)


class _Gated(_FakeExecutor):
    """An executor whose cases wait for ``gate``, and which notes each case it ran."""

    def __init__(self, gate: threading.Event, ran: list[str], started: threading.Semaphore):
        super().__init__()
        self.gate, self.ran, self.started = gate, ran, started

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        self.started.release()
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        self.ran.append(case.digest())
        return _verdict(case, Outcome.AGREE)


def _gated_pool(width: int) -> tuple[LaunchPool, threading.Event, list[str], threading.Semaphore]:
    gate, ran, started = threading.Event(), list[str](), threading.Semaphore(0)
    executors: list[Any] = [_Gated(gate, ran, started) for _ in range(width)]
    return LaunchPool(executors), gate, ran, started


def test_the_pool_queues_a_launch_per_executor_and_starts_it_when_one_is_free() -> None:
    pool, gate, ran, started = _gated_pool(2)
    a, b, *rest = first_cases(2 * LANE_DEPTH)
    running = [pool.submit([x], False, ["p"]) for x in (a, b)]
    for _ in running:
        assert started.acquire(timeout=30)  # both run: the executors are taken
    queued = [pool.submit([x], False, ["p"]) for x in rest]
    assert (pool.running, pool.unfinished, pool.has_room) == (2, 2 * LANE_DEPTH, False)
    with pytest.raises(RuntimeError, match="busy"):
        pool.submit([a], False, ["p"])  # every lane full: no room
    assert pool.cancel(queued[-1])  # not started: dropped
    assert queued[-1].cancelled() and pool.unfinished == 2 * LANE_DEPTH - 1 and pool.has_room
    gate.set()
    # the queued launches start on their lane's executor once that is free, with nothing
    # asked of the caller but their results
    assert [j.case for f in queued[:-1] for j in f.result(timeout=60).judged] == rest[:-1]
    assert [j.case for f in running for j in f.result(timeout=60).judged] == [a, b]
    assert sorted(ran) == sorted(x.digest() for x in (a, b, *rest[:-1]))  # the last never ran
    assert not pool.cancel(queued[0])  # a finished launch is not dropped
    assert pool.running == pool.unfinished == 0
    pool.close()


class _Recording(_Gated):
    """An executor whose cases wait for ``gate``, and which notes what it is asked to write
    ahead (and refuses the cases of ``refuse``)."""

    def __init__(
        self, gate: threading.Event, started: threading.Semaphore, refuse: Sequence[Case] = ()
    ) -> None:
        super().__init__(gate, [], started)
        self.refuse = {c.digest() for c in refuse}
        self.ahead: list[list[str]] = []

    def send_ahead(self, cases: Sequence[Case], **options: object) -> bool:
        digests = [c.digest() for c in cases]
        if self.refuse & set(digests):
            return False
        self.ahead.append(digests)
        return True


def test_the_pool_writes_launches_ahead_in_order_behind_a_running_launch_of_one_case() -> None:
    gate, started = threading.Event(), threading.Semaphore(0)
    a, b, c, d = first_cases(4)
    executor = _Recording(gate, started)
    pool = LaunchPool([executor])  # type: ignore[list-item]
    first = pool.submit([a], False, ["p"])
    assert executor.ahead == []  # nothing ran before it
    assert started.acquire(timeout=30)
    second = pool.submit([b, c], False, ["p"])
    assert executor.ahead == [[b.digest(), c.digest()]]  # behind the running single case
    third = pool.submit([d], False, ["p"])
    # a launch of several cases may rerun some alone after it: nothing is written behind it
    assert executor.ahead == [[b.digest(), c.digest()]]
    gate.set()
    for launch, cases in ((first, [a]), (second, [b, c]), (third, [d])):
        assert [j.case for j in launch.result(timeout=60).judged] == cases
    pool.close()


def test_nothing_is_written_ahead_of_a_launch_that_was_not() -> None:
    """A launch whose message could not be written ahead sends it when it starts: one queued
    behind it must not be written before it."""
    gate, started = threading.Event(), threading.Semaphore(0)
    a, b, c, d = first_cases(4)
    executor = _Recording(gate, started, refuse=[c])
    pool = LaunchPool([executor])  # type: ignore[list-item]
    launches = [pool.submit([a], False, ["p"])]
    assert started.acquire(timeout=30)
    launches += [pool.submit([x], False, ["p"]) for x in (b, c, d)]
    assert executor.ahead == [[b.digest()]]  # c refused, so d waits its turn too
    gate.set()
    assert [j.case for f in launches for j in f.result(timeout=60).judged] == [a, b, c, d]
    pool.close()


def test_a_closed_pool_drops_its_queued_launches() -> None:
    pool, gate, ran, started = _gated_pool(1)
    a, b = first_cases(2)
    first = pool.submit([a], False, ["p"])
    assert started.acquire(timeout=30)
    second = pool.submit([b], False, ["p"])
    pool.close()
    gate.set()
    assert second.cancelled()
    assert [j.case for j in first.result(timeout=60).judged] == [a]  # the gated fake ends it
    assert ran == [a.digest()]


def test_a_launch_that_starts_past_the_budget_is_cut_before_it_is_sent() -> None:
    pool, gate, ran, _ = _gated_pool(1)
    gate.set()
    (a,) = first_cases(1)
    assert [j.case for j in pool.submit([a], False, ["p"]).result(timeout=60).judged] == [a]
    for executor in pool.executors:
        executor.stop_at = time.monotonic() - 1.0  # the command's budget has ended
    with pytest.raises(BudgetSpent, match="before the launch started"):
        pool.submit([a], False, ["p"]).result(timeout=60)
    assert ran == [a.digest()]  # the second launch never reached the executor
    assert pool.running == pool.unfinished == 0
    pool.close()


def test_stopping_the_pooled_loop_cuts_its_queued_launches_without_running_them(
    tmp_path: Path,
) -> None:
    """``_drop`` after a stop: each launch begun is closed as cut in the write-ahead log; the
    queued ones are dropped before they start, the running ones waited for."""
    gate, ran, started = threading.Event(), list[str](), threading.Semaphore(0)

    class Opening(LaunchPool):  # the gate opens once the queued launches are dropped
        def cancel(self, future: Future[Ran]) -> bool:
            dropped = super().cancel(future)
            gate.set()
            return dropped

    executors: list[Any] = [_Gated(gate, ran, started) for _ in range(2)]
    pool = Opening(executors)
    out = RunDirectory(tmp_path)
    out.open()
    cases = first_cases(4)
    running: deque[_Running] = deque()
    for n, case in enumerate(cases):
        running.append(_Running(out.begin([case]), pool.submit([case], False, ["p"])))
        if n < 2:
            assert started.acquire(timeout=30)
    _drop(out, running, pool, wait=True)
    assert sorted(ran) == sorted(c.digest() for c in cases[:2])  # the queued two never ran
    assert not running
    assert RunDirectory(tmp_path).open() == []  # every launch closed: none left running
    pool.close()


class _FailsPacked(_FakeExecutor):
    """An executor on which the second case of a packed launch is WRONG, and every case
    alone AGREE."""

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        return _verdict(case, Outcome.AGREE)

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        return [
            _verdict(c, Outcome.WRONG if i == 1 else Outcome.AGREE) for i, c in enumerate(cases)
        ]


def _verdict(case: Case, outcome: Outcome) -> CaseResult:
    return CaseResult(case_digest=case.digest(), results=(PathResult(path="p", outcome=outcome),))


def test_a_pooled_launch_keeps_every_verdict_in_the_order_judging_asked_for_it() -> None:
    cases = first_cases(3)
    ran = run_launch(_FailsPacked(), cases, False, ["p"])  # type: ignore[arg-type]
    # the packed launch's three verdicts, then the second case's rerun alone
    assert [r.case_digest for r in ran.results] == [c.digest() for c in [*cases, cases[1]]]
    assert [r.results[0].outcome for r in ran.results] == [Outcome.AGREE, Outcome.WRONG] + [
        Outcome.AGREE
    ] * 2
    assert [j.result for j in ran.judged] == [ran.results[0], ran.results[3], ran.results[2]]
    assert all(any(j.result is r for r in ran.results) for j in ran.judged)
    assert [p.outcome for p in ran.judged[1].packed_only] == [Outcome.WRONG]


def test_a_pooled_campaign_judges_and_reports_as_the_sequential_one(tmp_path: Path) -> None:
    """Two launches at once, in-process executors: the same cases, verdicts, findings and
    groups as one at a time (no avoidance: the case list is then independent of when a
    group is established)."""

    def run(workers: int) -> CampaignReport:
        return campaign(
            tmp_path / f"w{workers}",
            ("torch-sdpa", "wrong-long-prefix"),
            groups=99,
            max_cases=40,
            plugins=(WRONG_PLUGIN,),
            seed=3,
            avoid=False,
            shrink=False,
            workers=workers,
        )

    one, two = run(1), run(2)
    assert one.config.workers == 1 and two.config.workers == 2
    assert two.cases == one.cases == 40
    assert two.case_digest == one.case_digest
    assert one.findings, "the planted bug gave no finding: the comparison shows nothing"
    assert [(f.case_digest, f.path, f.kind, f.group) for f in two.findings] == [
        (f.case_digest, f.path, f.kind, f.group) for f in one.findings
    ]
    assert {n: s.outcomes for n, s in two.paths.items()} == {
        n: s.outcomes for n, s in one.paths.items()
    }
    assert [(g.id, g.count, g.digests) for g in two.groups] == [
        (g.id, g.count, g.digests) for g in one.groups
    ]
    assert two.stop_reason == one.stop_reason == "40 cases run"


def test_a_pooled_campaign_that_stops_early_closes_the_launches_it_drops(
    tmp_path: Path,
) -> None:
    report = campaign(
        tmp_path,
        ("torch-sdpa", "wrong-long-prefix"),
        groups=1,
        max_cases=200,
        plugins=(WRONG_PLUGIN,),
        seed=3,
        workers=2,
    )
    assert report.stop_reason == "the campaign found what it was looking for"
    assert report.cases < 200
    # every launch begun is closed in the write-ahead log (judged, or dropped as cut): a
    # later run in the same folder finds nothing that died
    assert RunDirectory(tmp_path).open() == []


def test_isolated_pooled_workers_give_the_in_process_verdicts(tmp_path: Path) -> None:
    cases = first_cases(12, seed=4)

    def run(isolation: str, workers: int) -> CampaignReport:
        config = CampaignConfig(out_dir=tmp_path / isolation, workers=workers)
        with cpu_session(CPU_PATHS, isolation=isolation) as session:
            report = run_campaign(config, session, cases=iter(enumerate(cases)))
            if workers > 1:
                pool = session.launch_pool(workers)
                pids = {e.worker_pid for e in pool.executors}  # type: ignore[attr-defined]
                assert len(pids) == workers and None not in pids
                assert all(e.threads == 1 for e in pool.executors)  # type: ignore[attr-defined]
            return report

    alone, pooled = run("none", 1), run("process", 2)
    assert pooled.cases == alone.cases == len(cases)
    assert pooled.case_digest == alone.case_digest
    assert {n: s.outcomes for n, s in pooled.paths.items()} == {
        n: s.outcomes for n, s in alone.paths.items()
    }
    assert "isolation" in pooled.timings


def test_a_closed_isolated_executor_starts_no_worker() -> None:
    executor = IsolatedExecutor(resolve(["torch-sdpa"]), "cpu")
    executor.close()
    with pytest.raises(WorkerError, match="closed"):
        executor.evaluate(first_cases(1)[0])


def _args(**given: object) -> argparse.Namespace:
    fields: dict[str, object] = {
        "max_cases": None,
        "pack": None,
        "cases_per_variant": None,
        "hypothesis_every": None,
        "compile_ahead": None,
        "workers": None,
        "isolation": "process",
        "preset": None,
        "limits": None,
        "out": Path("difftest-out"),
        "json": None,
        "mode": None,
        "seed": 0,
        "no_known": True,
        "no_swarm": False,
        "no_avoid": False,
        "corpus": None,
        "graph": False,
        "ragged": False,
        "skip_softmax": False,
    }
    fields.update(given)
    return argparse.Namespace(**fields)


def test_a_cpu_campaign_runs_one_launch_per_usable_core_by_default() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    cores = usable_cores()
    assert default_workers(cpu, "process") == max(1, min(CPU_WORKERS_MAX, cores))
    assert default_workers(cpu, "none") == 1  # threads of one process would share its GIL
    assert default_workers(gpu, "process") == 1
    assert campaign_config(_args(), cpu).workers == default_workers(cpu, "process")
    assert campaign_config(_args(workers=3), cpu).workers == 3
    with pytest.raises(DifftestError, match="needs --isolation process"):
        campaign_config(_args(workers=2, isolation="none"), cpu)
    with pytest.raises(DifftestError, match="must be >= 1"):
        campaign_config(_args(workers=0), cpu)
