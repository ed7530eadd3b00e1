"""The sequential campaign runs its next launch while it accounts for the one before
(``BackgroundLaunch``, ``Session.begin_launch``): when the executor's cases run in a worker
process, the parent triages, records and draws while the worker computes. Nothing about a
verdict, the case list or the groups may depend on it, and a signal still means what it did."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from _planted import one_torch_thread  # noqa: F401  (autouse)

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig
from difftest.campaign.report import CampaignReport
from difftest.execution.executors import InProcessExecutor
from difftest.execution.interrupts import Interrupts
from difftest.execution.isolation import WorkerError
from difftest.execution.parallel import BackgroundLaunch
from difftest.execution.session import Session, Settings
from difftest.model.case import Case
from difftest.model.outcome import CaseResult
from difftest.paths.registry import KernelPath
from difftest.records.run_dir import RunDirectory
from difftest.triage.groups import Triage

ROOT = Path(__file__).resolve().parents[2]
WRONG_PLUGIN = str(ROOT / "tests" / "fixtures" / "wrong_path.py")
WAIT_S = 20.0
"""How long a test waits for the other thread before calling the loop sequential (far more
than a launch of these cases takes, even on a loaded machine)."""


class _Elsewhere(InProcessExecutor):
    """An in-process executor (real verdicts) that says its cases run elsewhere, so the
    session runs its launches in a thread; ``before_launch(n)`` is called as launch ``n``
    (counted from 0; reruns alone are not launches) starts, in that thread."""

    runs_elsewhere = True

    def __init__(
        self,
        paths: Sequence[KernelPath],
        device: torch.device,
        before_launch: Callable[[int], None] = lambda n: None,
    ) -> None:
        super().__init__(paths, device)
        self.before_launch = before_launch
        self.launches = 0
        self.threads: set[str] = set()
        self.closed = threading.Event()

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        self.threads.add(threading.current_thread().name)
        n, self.launches = self.launches, self.launches + 1
        self.before_launch(n)
        if self.closed.is_set():
            raise WorkerError("the isolated executor is closed")
        return super().evaluate_pack(cases, check_determinism=check_determinism, only=only)

    def close(self) -> None:
        self.closed.set()


def _session(
    paths: tuple[str, ...],
    factory: Callable[[Sequence[KernelPath]], object] | None,
    interrupts: Interrupts | None = None,
    plugins: tuple[str, ...] = (),
) -> Session:
    settings = Settings(device="cpu", paths=paths, plugins=plugins, isolation="none")
    return Session(
        settings,
        interrupts=interrupts or Interrupts(),
        executor_factory=factory,  # type: ignore[arg-type]
    )


def test_the_next_launch_starts_before_the_one_before_it_is_accounted_for(
    tmp_path: Path,
) -> None:
    """Accounting for launch ``n`` waits until launch ``n + 1`` has started: a loop that
    starts a launch only after accounting for the last would wait here for ever."""
    started = [threading.Event() for _ in range(8)]
    made: list[_Elsewhere] = []

    def factory(paths: Sequence[KernelPath]) -> _Elsewhere:
        made.append(_Elsewhere(paths, torch.device("cpu"), lambda n: started[n].set()))
        return made[-1]

    accounted: list[int] = []

    def progress(cases: int, findings: int, groups: int, elapsed: float) -> None:
        launch = len(accounted)
        accounted.append(cases)
        if launch + 1 < 6:  # six launches of four: the last has no successor
            assert started[launch + 1].wait(WAIT_S), f"launch {launch + 1} had not started"

    config = CampaignConfig(seed=5, max_cases=24, pack=4, out_dir=tmp_path, avoid=False)
    with _session(("torch-sdpa",), factory) as session:
        report = run_campaign(config, session, progress=progress)
    assert report.cases == 24 and report.stop_reason == "24 cases run"
    assert accounted == [4, 8, 12, 16, 20, 24]
    assert [e.launches for e in made] == [6]
    assert made[0].threads == {"difftest-launch_0"}  # not the main thread
    assert RunDirectory(tmp_path).open() == []  # every write-ahead entry was closed


def _campaign(tmp_path: Path, name: str, elsewhere: bool) -> CampaignReport:
    """The planted wrong path's campaign (findings, rechecks, a shrink, a group), its
    executor running launches in a thread (``elsewhere``) or at once."""

    def factory(paths: Sequence[KernelPath]) -> InProcessExecutor:
        return (
            _Elsewhere(paths, torch.device("cpu"))
            if elsewhere
            else InProcessExecutor(paths, torch.device("cpu"))
        )

    def enough(triage: Triage) -> bool:
        return any(g.established and g.minimal is not None and g.members for g in triage.groups)

    config = CampaignConfig(seed=3, max_cases=40, out_dir=tmp_path / name, shrink_runs=60)
    paths = ("torch-sdpa", "wrong-long-prefix")
    with _session(paths, factory, plugins=(WRONG_PLUGIN,)) as session:
        return run_campaign(config, session, stop_when=enough)


def test_a_campaign_in_the_background_finds_groups_and_cases_as_one_run_at_once(
    tmp_path: Path,
) -> None:
    """Rechecks and shrinks wait for the launch running on the executor, so both ways give
    the same case list, findings and groups."""
    here, there = _campaign(tmp_path, "here", False), _campaign(tmp_path, "there", True)
    assert here.findings, "the planted bug gave no finding: the comparison shows nothing"
    assert any(g.minimal_size for g in here.groups), "nothing was shrunk"
    assert there.case_digest == here.case_digest and there.cases == here.cases
    assert [(f.case_digest, f.path, f.kind, f.group) for f in there.findings] == [
        (f.case_digest, f.path, f.kind, f.group) for f in here.findings
    ]
    assert [(g.id, g.count, g.minimal_size, g.trigger) for g in there.groups] == [
        (g.id, g.count, g.minimal_size, g.trigger) for g in here.groups
    ]
    assert there.stop_reason == here.stop_reason


def test_a_first_signal_lets_the_launch_in_flight_finish_and_counts_it(tmp_path: Path) -> None:
    interrupts = Interrupts()

    def progress(cases: int, findings: int, groups: int, elapsed: float) -> None:
        if cases == 4:  # launch 0 accounted for: launch 1 is already running
            interrupts.request("SIGINT")

    def factory(paths: Sequence[KernelPath]) -> _Elsewhere:
        return _Elsewhere(paths, torch.device("cpu"))

    config = CampaignConfig(seed=5, max_cases=40, pack=4, out_dir=tmp_path, avoid=False)
    with _session(("torch-sdpa",), factory, interrupts) as session:
        report = run_campaign(config, session, progress=progress)
    assert report.interrupted and report.stop_reason == "interrupted (SIGINT)"
    assert report.cases == 8  # the launch in flight was judged and counted, no third began
    assert RunDirectory(tmp_path).open() == []


def test_a_second_signal_abandons_the_launch_in_flight_and_stops_its_executor(
    tmp_path: Path,
) -> None:
    interrupts = Interrupts()
    made: list[_Elsewhere] = []

    def hold(n: int) -> None:
        if n == 1:  # runs until its executor is closed, as a worker runs until stopped
            assert made[0].closed.wait(WAIT_S), "the abandoned launch's executor stayed open"

    def factory(paths: Sequence[KernelPath]) -> _Elsewhere:
        made.append(_Elsewhere(paths, torch.device("cpu"), hold))
        return made[-1]

    def progress(cases: int, findings: int, groups: int, elapsed: float) -> None:
        if cases == 4:  # launch 1 runs: a second signal comes, as the handler raises it
            interrupts.request("SIGINT")
            interrupts.count = 2
            raise KeyboardInterrupt

    config = CampaignConfig(seed=5, max_cases=40, pack=4, out_dir=tmp_path, avoid=False)
    with _session(("torch-sdpa",), factory, interrupts) as session:
        report = run_campaign(config, session, progress=progress)
        assert made[0].closed.is_set()
        # the session forgot the closed executor: what it runs next gets a new one
        assert session.executor() is not made[0]
    assert report.interrupted and report.cases == 4
    # the abandoned launch is left open in the write-ahead log, as when a worker is stopped
    # mid-launch: a later run in this folder reports its cases
    assert len(RunDirectory(tmp_path).open()) == 4


def test_a_launch_in_this_process_runs_at_once_and_its_errors_wait_for_its_result() -> None:
    background = BackgroundLaunch()
    done: list[int] = []

    class Failing(InProcessExecutor):
        def evaluate_pack(self, cases, *, check_determinism=False, only=None):  # type: ignore[no-untyped-def]
            done.append(len(cases))
            raise RuntimeError("planted failure")

    from difftest.campaign.planning import planned_cases

    cases = [c for _, c in itertools.islice(planned_cases(CampaignConfig(seed=1), "cpu"), 2)]
    future = background.start(Failing([], torch.device("cpu")), cases, False, ["p"])
    assert done == [2] and future.done() and not background.in_background
    with pytest.raises(RuntimeError, match="planted failure"):
        future.result()


def test_a_launch_started_after_the_campaign_found_what_it_wanted_is_dropped(
    tmp_path: Path,
) -> None:
    """``stop_when`` ends the exploration on launch 0: launch 1 was already running (started
    before launch 0 was accounted for) and is dropped, unjudged, its entry closed as cut, as a
    loop that starts a launch only after accounting for the last would never have run it."""
    made: list[_Elsewhere] = []

    def factory(paths: Sequence[KernelPath]) -> _Elsewhere:
        made.append(_Elsewhere(paths, torch.device("cpu")))
        return made[-1]

    config = CampaignConfig(seed=5, max_cases=40, pack=4, out_dir=tmp_path, avoid=False)
    with _session(("torch-sdpa",), factory) as session:
        report = run_campaign(config, session, stop_when=lambda triage: True)
    assert report.stop_reason == "the campaign found what it was looking for"
    assert report.cases == 4 and made[0].launches == 2
    assert RunDirectory(tmp_path).open() == []


def test_a_second_signal_while_the_loop_waits_for_its_launch_abandons_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop waits for launch 1 before it starts launch 2 (begun: its write-ahead entry
    written); a second signal then stops launch 1's executor, and launch 2, which never ran,
    is closed as cut, not left for the next run to report as died."""
    import difftest.campaign.sequential as sequential

    interrupts = Interrupts()
    made: list[_Elsewhere] = []

    def hold(n: int) -> None:
        if n == 1:
            assert made[0].closed.wait(WAIT_S), "the abandoned launch's executor stayed open"

    def factory(paths: Sequence[KernelPath]) -> _Elsewhere:
        made.append(_Elsewhere(paths, torch.device("cpu"), hold))
        return made[-1]

    calls: list[int] = []
    real_wait = sequential.wait

    def signalled_wait(futures, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(calls))
        if len(calls) == 2:  # the loop waits for launch 1: a second signal, as its handler
            interrupts.request("SIGINT")
            interrupts.count = 2
            raise KeyboardInterrupt
        return real_wait(futures, *args, **kwargs)

    monkeypatch.setattr(sequential, "wait", signalled_wait)
    config = CampaignConfig(seed=5, max_cases=40, pack=4, out_dir=tmp_path, avoid=False)
    with _session(("torch-sdpa",), factory, interrupts) as session:
        report = run_campaign(config, session)
        assert made[0].closed.is_set() and session.executor() is not made[0]
    assert report.interrupted and report.cases == 4
    assert len(RunDirectory(tmp_path).open()) == 4  # launch 1's cases only
