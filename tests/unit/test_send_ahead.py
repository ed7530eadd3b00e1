"""A case written to a worker while it runs the one before (``IsolatedExecutor.send_ahead``,
and the launch pool that uses it): run next without being sent again, withdrawn when another
message goes first, lost with a worker that crashes, and never blamed for that crash."""

from __future__ import annotations

import runpy
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.execution.isolation.isolated import AHEAD_MAX
from difftest.execution.parallel import LaunchPool
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import CaseResult, Outcome, PathResult
from difftest.paths import all_paths, resolve, unregister

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
DEADLINE = Deadline(base_s=30.0, cold_s=0.0, grace_s=0.5)


@pytest.fixture(scope="module", autouse=True)
def bad_paths() -> Iterator[None]:
    """The fixture plugin's paths, registered in this process while this module runs."""
    before = {p.name for p in all_paths()}
    runpy.run_path(PLUGIN)
    yield
    for path in all_paths():
        if path.name not in before:
            unregister(path.name)


@pytest.fixture
def slow_first_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``slow-once`` sleeps a second on its first call (in whichever worker makes it)."""
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_MARK", str(tmp_path / "slept"))
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_S", "1")


def case(seed: int) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=3),
        seed=seed,
    )


def until(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < end, f"waited a minute for {what}"
        time.sleep(0.005)


def running_path(executor: IsolatedExecutor) -> str | None:
    worker = executor._worker
    return None if worker is None else worker.progress.read().running


def message_started(executor: IsolatedExecutor) -> int:
    worker = executor._worker
    return 0 if worker is None else worker.progress.read().message


def outcomes(result: CaseResult) -> dict[str, Outcome]:
    return {r.path: r.outcome for r in result.results}


def test_cases_written_ahead_run_next_without_being_sent_again(slow_first_call: None) -> None:
    paths = resolve(["slow-once", "good-sdpa"])
    first, second = case(1), case(2)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=DEADLINE) as executor:
        assert not executor.send_ahead([second])  # nothing of ours runs: nothing written
        executor.start()
        with ThreadPoolExecutor(1) as thread:
            running = thread.submit(executor.evaluate, first)
            until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
            pid = executor.worker_pid
            behind = [case(seed) for seed in range(2, 2 + AHEAD_MAX)]
            assert all(executor.send_ahead([c]) for c in behind)
            assert not executor.send_ahead([case(99)])  # AHEAD_MAX messages ahead at most
            assert running.result(timeout=60).case_digest == first.digest()
        # the worker went on to the cases behind by itself, the last included: nobody has
        # asked for them yet
        last = 1 + AHEAD_MAX
        until(lambda: message_started(executor) == last, f"the worker to start message {last}")
        for c in behind:  # taken in the order written
            result = executor.evaluate(c)
            assert result.case_digest == c.digest()
            assert outcomes(result) == {"slow-once": Outcome.AGREE, "good-sdpa": Outcome.AGREE}
        assert executor.worker_pid == pid and executor.replacements == 0
        assert next(executor._serials) == 2 + AHEAD_MAX  # each message written once
    assert not executor.send_ahead([second])  # closed


def test_a_message_written_ahead_is_withdrawn_when_another_goes_first(
    slow_first_call: None,
) -> None:
    paths = resolve(["slow-once", "good-sdpa"])
    first, second, third = case(1), case(2), case(3)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=DEADLINE) as executor:
        executor.start()
        with ThreadPoolExecutor(1) as thread:
            running = thread.submit(executor.evaluate, first)
            until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
            assert executor.send_ahead([second])
            running.result(timeout=60)
        # the third goes first: the worker runs the second (its answer is skipped), then it
        third_result = executor.evaluate(third)
        assert third_result.case_digest == third.digest()
        second_result = executor.evaluate(second)  # written again, answered
        assert second_result.case_digest == second.digest()
        assert set(outcomes(second_result).values()) == {Outcome.AGREE}
        assert executor.replacements == 0
        assert next(executor._serials) == 5  # first, second ahead, third, second again


def test_a_crash_is_blamed_on_the_running_case_not_the_one_written_behind_it(
    slow_first_call: None,
) -> None:
    """The worker dies in the first case's second path with the next case in its pipe: the
    crash is the first case's, and the next case, gone with the worker, is sent again to the
    new one and judged there."""
    paths = resolve(["slow-once", "bad-exit", "good-sdpa"])
    first, second = case(1), case(2)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=DEADLINE) as executor:
        executor.start()
        with ThreadPoolExecutor(1) as thread:
            running = thread.submit(executor.evaluate, first, only=["slow-once", "bad-exit"])
            until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
            assert executor.send_ahead([second], only=["good-sdpa"])
            crashed = running.result(timeout=60)
        assert crashed.case_digest == first.digest()
        assert outcomes(crashed) == {"slow-once": Outcome.AGREE, "bad-exit": Outcome.CRASH}
        assert executor.replacements == 1
        result = executor.evaluate(second, only=["good-sdpa"])
        assert result.case_digest == second.digest()
        assert outcomes(result) == {"good-sdpa": Outcome.AGREE}
        assert executor.replacements == 1  # the second case ran in the replacement


# -- the pool -------------------------------------------------------------------------------------


class _Recording:
    """A fake executor whose cases wait for ``gate``, and which notes what it is asked to
    write ahead (and refuses the cases of ``refuse``)."""

    def __init__(
        self, gate: threading.Event, started: threading.Semaphore, refuse: Sequence[Case] = ()
    ) -> None:
        self.paths: Sequence[object] = ()
        self.stop_at: float | None = None
        self.gate, self.started = gate, started
        self.refuse = {c.digest() for c in refuse}
        self.ahead: list[list[str]] = []

    def evaluate(
        self, case: Case, *, check_determinism: bool = False, only: Sequence[str] | None = None
    ) -> CaseResult:
        self.started.release()
        assert self.gate.wait(timeout=30), "the test never opened the gate"
        return CaseResult(
            case_digest=case.digest(), results=(PathResult(path="p", outcome=Outcome.AGREE),)
        )

    def evaluate_pack(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> list[CaseResult]:
        return [self.evaluate(c) for c in cases]

    def send_ahead(
        self,
        cases: Sequence[Case],
        *,
        check_determinism: bool = False,
        only: Sequence[str] | None = None,
    ) -> bool:
        digests = [c.digest() for c in cases]
        if self.refuse & set(digests):
            return False
        self.ahead.append(digests)
        return True

    def close(self) -> None:
        pass


def test_the_pool_writes_launches_ahead_in_order_behind_a_running_launch_of_one_case() -> None:
    gate, started = threading.Event(), threading.Semaphore(0)
    a, b, c, d = case(1), case(2), case(3), case(4)
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
    a, b, c, d = case(1), case(2), case(3), case(4)
    executor = _Recording(gate, started, refuse=[c])
    pool = LaunchPool([executor])  # type: ignore[list-item]
    launches = [pool.submit([a], False, ["p"])]
    assert started.acquire(timeout=30)
    launches += [pool.submit([x], False, ["p"]) for x in (b, c, d)]
    assert executor.ahead == [[b.digest()]]  # c refused, so d waits its turn too
    gate.set()
    assert [j.case for f in launches for j in f.result(timeout=60).judged] == [a, b, c, d]
    pool.close()


def test_closing_with_a_message_written_ahead_and_never_taken_stops_the_worker_at_once(
    slow_first_call: None,
) -> None:
    """Its launch was cancelled: the worker would run a case nobody waits for, so it is
    terminated instead of asked to stop after it (which it would answer with exit code 0)."""
    paths = resolve(["slow-once", "good-sdpa"])
    executor = IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=DEADLINE)
    executor.start()
    with ThreadPoolExecutor(1) as thread:
        running = thread.submit(executor.evaluate, case(1))
        until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
        assert executor.send_ahead([case(2)])
        running.result(timeout=60)
    worker = executor._worker
    assert worker is not None
    executor.close()
    assert worker.process.exitcode == -signal.SIGTERM


def test_closing_an_executor_with_nothing_ahead_lets_its_worker_stop_cleanly() -> None:
    executor = IsolatedExecutor(resolve(["good-sdpa"]), "cpu", plugins=[PLUGIN], deadline=DEADLINE)
    executor.evaluate(case(1))
    worker = executor._worker
    assert worker is not None
    executor.close()
    assert worker.process.exitcode == 0
