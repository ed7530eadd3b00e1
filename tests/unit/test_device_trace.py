"""``difftest.execution.device_trace``: an isolated worker's window of its own activity, written
where ``DIFFTEST_DEVICE_TRACE_DIR`` says, with absolute timestamps (on a CPU the window holds
the host's operators; on a GPU, its kernels)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from difftest.execution import device_trace


def test_the_window_is_start_and_length_in_seconds() -> None:
    assert device_trace.window(None) == device_trace.DEFAULT_WINDOW
    assert device_trace.window(" ") == device_trace.DEFAULT_WINDOW
    assert device_trace.window("0,2.5") == (0.0, 2.5)
    for bad in ("5", "a,b", "1,2,3", "-1,2", "1,0"):
        with pytest.raises(device_trace.WindowError, match="DIFFTEST_DEVICE_TRACE_WINDOW"):
            device_trace.window(bad)


def test_nothing_is_traced_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device_trace.DIR_ENV, raising=False)
    assert device_trace.from_env(cuda=False) is None


def _run(
    tmp_path: Path, window: str, **more: str
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    env = {
        **os.environ,
        device_trace.DIR_ENV: str(tmp_path / "traces"),
        device_trace.WINDOW_ENV: window,
        **more,
    }
    # 8 s: a window of 0.5,1 closes when its worker next waits or takes a launch; in a run of
    # 4 s on a loaded machine the run's end came first (a worker holding an unsent launch is
    # stopped at once, its window unwritten: 1 failure in a few runs beside CI)
    command = [sys.executable, "-m", "difftest", "run", "--device", "cpu", "--budget-s", "8"]
    before = time.time()
    done = subprocess.run(
        [*command, "--workers", "2", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return done, before, time.time()


def test_each_worker_writes_its_window_on_the_wall_clock(tmp_path: Path) -> None:
    done, before, after = _run(tmp_path, "0.5,1")
    assert done.returncode == 0, done.stderr
    files = sorted((tmp_path / "traces").glob("worker-*.trace.json"))
    assert len(files) == 2, files
    for f in files:
        data = json.loads(f.read_text())
        ops = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        assert ops, f  # the window held the worker's operators
        starts = [data["baseTimeNanoseconds"] + e["ts"] * 1000 for e in ops]
        # absolute: inside the run, after the worker's first half second of it
        assert before * 1e9 < min(starts) and max(starts) < after * 1e9
        # the window's own bounds beside it, on the same clock, around what it recorded
        bounds = json.loads(Path(device_trace.window_file(str(f))).read_text())
        assert bounds["pid"] == int(f.name.split("-")[1].split(".")[0])
        assert before * 1e9 < bounds["open_ns"] <= min(starts)
        assert max(starts) <= bounds["close_ns"] < after * 1e9
        assert bounds["close_ns"] - bounds["open_ns"] >= 1e9  # LENGTH, 1 s
        # what the worker did in it: launches handled, their cases, its waits for them
        assert 1 <= bounds["messages"] <= bounds["cases"]
        assert 0.0 <= bounds["waited_s"] <= (bounds["close_ns"] - bounds["open_ns"]) / 1e9
    assert len(list((tmp_path / "traces").glob("worker-*.window.json"))) == 2
    assert not list((tmp_path / "traces").glob("*.partial"))


def test_a_bad_window_stops_the_run_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done, _, _ = _run(tmp_path, "soon")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "DIFFTEST_DEVICE_TRACE_WINDOW='soon'" in done.stderr


def test_a_window_counts_the_launches_cases_and_waits_inside_it(tmp_path: Path) -> None:
    """The message that opens the window counts and its wait before it does not; a wait inside
    counts; the message that closes the window does not, and its wait counts at most the time
    since the window opened; after the window nothing changes."""
    trace = device_trace.DeviceTrace(str(tmp_path / "a"), 0.0, 60.0, cuda=False)
    os.makedirs(tmp_path / "a")
    trace.tick(cases=4, waited_s=5.0)  # opens the window: 1 message, 4 cases, no wait
    time.sleep(0.05)
    trace.tick(cases=2, waited_s=0.02)  # inside: a wait of 0.02 s
    trace.close()
    bounds = json.loads(Path(trace.bounds_file).read_text())
    assert (bounds["messages"], bounds["cases"], bounds["waited_s"]) == (2, 6, 0.02)
    trace.tick(cases=1, waited_s=1.0)  # after the window: nothing changes
    assert json.loads(Path(trace.bounds_file).read_text()) == bounds

    short = device_trace.DeviceTrace(str(tmp_path / "b"), 0.0, 0.01, cuda=False)
    os.makedirs(tmp_path / "b")
    short.tick(cases=3, waited_s=0.0)
    time.sleep(0.05)
    short.tick(cases=7, waited_s=9.0)  # closes it
    assert short.written
    bounds = json.loads(Path(short.bounds_file).read_text())
    assert (bounds["messages"], bounds["cases"]) == (1, 3)
    age = (bounds["close_ns"] - bounds["open_ns"]) / 1e9
    assert 0.05 <= bounds["waited_s"] <= age + 1e-3 < 9.0


def test_a_window_closes_on_time_while_the_worker_waits(tmp_path: Path) -> None:
    """With no message coming, the wait closes the window when it is due (its wait counted)
    and then goes on waiting; with a message there, the wait returns and the window stays."""
    parent, child = multiprocessing.Pipe()
    trace = device_trace.DeviceTrace(str(tmp_path), 0.0, 0.3, cuda=False)
    trace.tick(cases=1, waited_s=0.0)  # opens it
    parent.send_bytes(b"x")
    asked = time.monotonic()
    trace.wait_for_message(child, asked)  # a message is there: no close
    assert not trace.written and child.recv_bytes() == b"x"
    asked = time.monotonic()  # both read before the timer starts: the message comes after
    message_ns = time.time_ns() + 1_000_000_000  # both, a second at the earliest
    threading.Timer(1.0, parent.send_bytes, args=(b"y",)).start()
    trace.wait_for_message(child, asked)  # closes at about 0.3 s, returns with the message
    assert trace.written and time.monotonic() - asked >= 1.0
    bounds = json.loads(Path(trace.bounds_file).read_text())
    age = (bounds["close_ns"] - bounds["open_ns"]) / 1e9
    assert age >= 0.3 and bounds["close_ns"] < message_ns  # on time, not at the message
    assert 0.0 < bounds["waited_s"] <= age
    assert (bounds["messages"], bounds["cases"]) == (1, 1)


def test_the_number_of_tracing_workers_is_a_whole_number_of_at_least_one() -> None:
    assert device_trace.workers_limit(None) is None
    assert device_trace.workers_limit("") is None
    assert device_trace.workers_limit("3") == 3
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(device_trace.WindowError, match="DIFFTEST_DEVICE_TRACE_WORKERS"):
            device_trace.workers_limit(bad)


def test_only_the_first_workers_claim_a_slot(tmp_path: Path) -> None:
    assert [device_trace.claim_slot(str(tmp_path), 2) for _ in range(3)] == [True, True, False]
    assert device_trace.claim_slot(str(tmp_path), None)  # no limit: every worker


def test_the_slot_goes_to_the_first_worker_to_open_a_window_not_the_first_to_start(
    tmp_path: Path,
) -> None:
    """With one tracing worker, a worker that starts first but handles no message after its
    START (the session's own, say) does not take the slot from one that does: in Run 47 such
    a run left no trace."""
    idle = device_trace.DeviceTrace(str(tmp_path), 0.0, 60.0, cuda=False, limit=1)
    busy = device_trace.DeviceTrace(str(tmp_path), 0.0, 60.0, cuda=False, limit=1)
    busy.tick(cases=2)  # the first message after START: claims the slot, opens its window
    assert busy.opened is not None and not busy.written
    idle.tick(cases=1)  # its first message comes later: the slot is taken
    assert idle.opened is None and idle.written  # never traces, writes nothing
    busy.close()
    idle.close()
    assert [p.name for p in tmp_path.glob("worker-*.trace.json")] == [Path(busy.file).name]
    late = device_trace.DeviceTrace(str(tmp_path / "c"), 3600.0, 60.0, cuda=False, limit=1)
    os.makedirs(tmp_path / "c")
    late.tick(cases=1)  # before its START: no slot claimed yet
    assert not list((tmp_path / "c").glob("slot-*"))


def test_with_a_limit_of_one_only_one_worker_traces(tmp_path: Path) -> None:
    done, _, _ = _run(tmp_path, "0.5,1", **{device_trace.WORKERS_ENV: "1"})
    assert done.returncode == 0, done.stderr
    traces = tmp_path / "traces"
    assert len(list(traces.glob("worker-*.trace.json"))) == 1
    assert len(list(traces.glob("worker-*.window.json"))) == 1


def test_a_bad_number_of_workers_stops_the_run_with_one_line_and_exit_2(tmp_path: Path) -> None:
    done, _, _ = _run(tmp_path, "0.5,1", **{device_trace.WORKERS_ENV: "all"})
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "DIFFTEST_DEVICE_TRACE_WORKERS='all'" in done.stderr
