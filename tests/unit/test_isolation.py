"""Crash and hang isolation: the isolated executor, its deadlines, the wire format, the
sanitizer wrapper, and what a killed campaign leaves on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from difftest.execution.evaluate import evaluate
from difftest.execution.isolation import (
    Deadline,
    IsolatedExecutor,
    RemoteError,
    WorkerError,
    case_result_from_json,
)
from difftest.execution.isolation.isolated import AHEAD_MAX
from difftest.execution.isolation.wire import Progress
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import CaseResult, Outcome
from difftest.paths import all_paths, register_path, resolve, torch_sdpa, unregister
from difftest.records import sanitizer
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.records.sanitizer import parse_sanitizer_output, run_under_sanitizer

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "tests" / "fixtures" / "bad_paths.py")
FAST = Deadline(base_s=2.0, cold_s=0.0, grace_s=0.5)
"""Hangs are declared after 2 s (plus a little for the case's work)."""
PATIENT = Deadline(base_s=30.0, cold_s=0.0, grace_s=0.5)
"""No hang in a test about something else, however loaded the machine."""


@pytest.fixture(scope="module", autouse=True)
def bad_paths() -> Iterator[None]:
    """The fixture plugin's paths, registered in this process only while this module runs (a
    test elsewhere that runs every registered path in-process must never meet them)."""
    before = {p.name for p in all_paths()}
    runpy.run_path(PLUGIN)
    yield
    for path in all_paths():
        if path.name not in before:
            unregister(path.name)


def small_case(seed: int = 7, prefixes: tuple[int, ...] = (5, 9)) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=prefixes, q_len=3),
        seed=seed,
    )


def _without_seconds(result: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in result.items() if k != "seconds"}


# -- deadlines ----------------------------------------------------------------------------------


def test_deadline_grows_with_the_work_and_the_cold_start() -> None:
    d = Deadline(base_s=1.0, per_gwork_s=1000.0, per_melem_s=0.0, cold_s=50.0)
    small, big = small_case(prefixes=(5,)), small_case(prefixes=(500, 900))
    assert small.work() < big.work()
    assert d.for_path(small, cold=False) < d.for_path(big, cold=False)
    assert d.for_path(big, cold=True) == pytest.approx(d.for_path(big, cold=False) + 50.0)
    once = d.for_path(big, cold=False) - d.base_s
    twice = d.for_path(big, cold=False, check_determinism=True) - d.base_s
    assert twice == pytest.approx(2 * once)
    assert d.for_setup(big) > d.setup_s


def test_deadline_defaults_are_per_device_and_validated() -> None:
    cpu, gpu = Deadline.for_device("cpu"), Deadline.for_device("cuda")
    assert gpu.per_gwork_s < cpu.per_gwork_s
    assert gpu.cold_s > cpu.cold_s  # JIT compiles on the first case of a variant
    with pytest.raises(ValueError, match="grace_s"):
        Deadline(grace_s=-1.0)
    with pytest.raises(ValueError, match="base_s"):
        Deadline(base_s=0.0)


def test_compile_variant_ignores_the_seed_and_sizes_but_not_the_dtypes() -> None:
    case = small_case()
    assert case.compile_variant() == small_case(seed=99, prefixes=(40,)).compile_variant()
    fp16 = case.replace(attention=dataclasses.replace(case.attention, q_dtype="fp16"))
    assert fp16.compile_variant() != case.compile_variant()


# -- the wire format ----------------------------------------------------------------------------


def test_case_result_round_trips_through_json() -> None:
    paths = resolve(["good-sdpa", "torch-sdpa", "torch-paged-online"])
    result = evaluate(small_case(), paths, "cpu")
    assert result.pairs  # the round trip covers pairs as well
    wire = json.loads(json.dumps(result.to_json()))
    assert case_result_from_json(wire).to_json() == result.to_json()


# -- the isolated executor ----------------------------------------------------------------------

ALL_BAD = [
    "good-sdpa",
    "bad-abort",
    "bad-segfault",
    "bad-hang",
    "bad-exit",
    "bad-sticky",
    "torch-sdpa",
]


@pytest.fixture(scope="module")
def bad_run() -> Iterator[tuple[IsolatedExecutor, dict[str, dict[str, object]], float]]:
    """One case through every misbehaving path and two good ones, in one executor."""
    executor = IsolatedExecutor(resolve(ALL_BAD), "cpu", plugins=[PLUGIN], deadline=FAST)
    try:
        result = executor.evaluate(small_case())
        by_path = {r.path: r.to_json() for r in result.results}
        assert [r.path for r in result.results] == ALL_BAD
        yield executor, by_path, result.timings["isolation"]
    finally:
        executor.close()


@pytest.mark.parametrize(
    ("path", "outcome", "reason"),
    [
        ("bad-abort", "CRASH", "worker process killed by SIGABRT while running this path"),
        ("bad-segfault", "CRASH", "worker process killed by SIGSEGV while running this path"),
        ("bad-exit", "CRASH", "worker process exited with code 3 while running this path"),
        ("bad-hang", "HANG", "path bad-hang gave no result within its "),
        ("bad-sticky", "CRASH", "RuntimeError: CUDA error: an illegal memory access"),
    ],
)
def test_each_misbehaving_path_gets_its_own_verdict(
    bad_run: tuple[IsolatedExecutor, dict[str, dict[str, object]], float],
    path: str,
    outcome: str,
    reason: str,
) -> None:
    _, by_path, _ = bad_run
    assert by_path[path]["outcome"] == outcome
    assert str(by_path[path]["reason"]).startswith(reason)


def test_a_crash_keeps_the_dead_workers_last_output(
    bad_run: tuple[IsolatedExecutor, dict[str, dict[str, object]], float],
) -> None:
    _, by_path, _ = bad_run
    metrics = by_path["bad-segfault"]["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["exitcode"] == -signal.SIGSEGV
    output = "\n".join(metrics["worker_output"])
    assert "Segmentation fault" in output and "_segfault" in output  # faulthandler's dump


def test_the_other_paths_results_are_intact(
    bad_run: tuple[IsolatedExecutor, dict[str, dict[str, object]], float],
) -> None:
    executor, by_path, isolation_s = bad_run
    alone = evaluate(small_case(), resolve(["good-sdpa", "torch-sdpa"]), "cpu")
    for r in alone.results:
        assert r.outcome is Outcome.AGREE
        assert _without_seconds(by_path[r.path]) == _without_seconds(r.to_json())
    # four deaths and one poisoned worker, and the hang cut twice at its deadline (once, and
    # once more on the confirming rerun): six replacements
    assert executor.replacements == 6
    assert executor.confirmations == 1
    assert isolation_s >= FAST.base_s


def test_the_worker_is_reused_and_findings_pass_through() -> None:
    paths = resolve(["good-sdpa", "flaky-noise"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=FAST) as executor:
        executor.start()
        pid = executor.worker_pid
        plain = executor.evaluate(small_case())
        checked = executor.evaluate(small_case(seed=8), check_determinism=True)
        assert executor.worker_pid == pid and executor.replacements == 0
    assert [r.outcome for r in plain.results] == [Outcome.AGREE, Outcome.AGREE]
    assert [r.outcome for r in checked.results] == [Outcome.AGREE, Outcome.NONDETERMINISTIC]
    flaky = checked.result_for("flaky-noise")
    assert flaky is not None and flaky.metrics.nondeterministic_elements == 1
    in_process = evaluate(small_case(seed=8), [paths[0]], "cpu")
    assert _without_seconds(checked.results[0].to_json()) == _without_seconds(
        in_process.results[0].to_json()
    )


def test_a_worker_spawned_early_is_not_waited_for_then_runs_the_first_case() -> None:
    paths = resolve(["good-sdpa"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=FAST) as executor:
        executor.spawn_early()
        pid = executor.worker_pid
        assert pid is not None
        worker = executor._worker
        assert worker is not None and not worker.ready  # started, not waited for
        executor.spawn_early()  # a second call starts no other worker
        assert executor.worker_pid == pid
        result = executor.evaluate(small_case())
        assert executor.worker_pid == pid and executor.replacements == 0
    assert [r.outcome for r in result.results] == [Outcome.AGREE]


def test_a_profiled_worker_writes_where_its_time_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pstats

    from difftest.execution.isolation.worker import PROFILE_DIR_ENV

    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path / "prof"))  # the spawned worker inherits it
    paths = resolve(["good-sdpa"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=FAST) as executor:
        executor.start()
        pid = executor.worker_pid
        result = executor.evaluate(small_case())
    assert [r.outcome for r in result.results] == [Outcome.AGREE]
    files = list((tmp_path / "prof").iterdir())
    assert [f.name for f in files] == [f"worker-{pid}.prof"]  # written when it was stopped
    functions = {name for (_, _, name) in pstats.Stats(str(files[0])).stats}  # type: ignore[attr-defined]
    assert "evaluate_pack" in functions and "materialize" in functions


def test_a_profile_dump_cut_short_leaves_the_last_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped while it writes its profile (the parent stops its workers when a
    campaign ends) leaves the dump before, whole: the new one is written beside it and renamed
    over it (a truncated file once made the warm campaign script's profile listing fail)."""
    import pstats

    from difftest.execution.isolation import worker
    from difftest.execution.isolation.worker import PROFILE_DIR_ENV

    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    profile = worker._profiler()
    assert profile is not None
    try:
        sum(range(1000))
        profile.dump()
        whole = Path(profile.file).read_bytes()

        def stopped_midway(file: str) -> None:
            Path(file).write_bytes(whole[:7])
            raise KeyboardInterrupt

        monkeypatch.setattr(profile.profiler, "dump_stats", stopped_midway)
        with pytest.raises(KeyboardInterrupt):
            profile.dump()
    finally:
        profile.profiler.disable()
    assert Path(profile.file).read_bytes() == whole
    assert pstats.Stats(profile.file).total_calls > 0  # type: ignore[attr-defined]


def test_an_unprofiled_worker_writes_no_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from difftest.execution.isolation.worker import PROFILE_DIR_ENV

    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with IsolatedExecutor(
        resolve(["good-sdpa"]), "cpu", plugins=[PLUGIN], deadline=FAST
    ) as executor:
        executor.evaluate(small_case())
    assert list(tmp_path.iterdir()) == []


def test_a_worker_that_dies_before_any_path_starts_is_retried_once_then_refused() -> None:
    paths = resolve(["bad-supports"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], spare=False) as executor:
        with pytest.raises(WorkerError, match="SIGABRT before any path started, twice"):
            executor.evaluate(small_case())
        assert executor.replacements == 2


def test_an_error_in_difftest_itself_is_raised_and_the_worker_kept() -> None:
    paths = resolve(["bad-precision"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=FAST) as executor:
        for _ in range(2):
            with pytest.raises(RemoteError, match="ValueError: no precision for this case"):
                executor.evaluate(small_case())
        assert executor.replacements == 0


def test_a_plugin_that_fails_to_import_stops_the_executor_with_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise ImportError('no kernel library here')\n")
    with IsolatedExecutor(resolve(["torch-sdpa"]), "cpu", plugins=[str(broken)]) as executor:
        with pytest.raises(WorkerError, match=r"could not start: plugin .* no kernel library here"):
            executor.evaluate(small_case())


def test_a_path_registered_only_in_this_process_is_refused() -> None:
    path = register_path("only-here", torch_sdpa.run)
    try:
        with IsolatedExecutor([path], "cpu") as executor:
            with pytest.raises(WorkerError, match="unknown path 'only-here'"):
                executor.evaluate(small_case())
    finally:
        unregister("only-here")


_ORPHAN_SCRIPT = """
from difftest.model.case import Case
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.paths import load_plugin, resolve

if __name__ == "__main__":
    load_plugin({plugin!r})
    executor = IsolatedExecutor(resolve(["bad-hang"]), "cpu", plugins=[{plugin!r}],
                                deadline=Deadline(base_s=600.0))
    executor.start()
    print(executor.worker_pid, executor._worker.log_path, flush=True)
    executor.evaluate(Case.from_json({case}))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_a_killed_parent_takes_its_hung_worker_with_it(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT.format(plugin=PLUGIN, case=small_case().to_json()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True
    ) as parent:
        assert parent.stdout is not None
        pid, log_path = parent.stdout.readline().split()
        worker_pid = int(pid)
        assert not Path(log_path).exists()  # the worker's log lives on as descriptors only
        time.sleep(0.5)  # let it enter the hanging path
        assert _alive(worker_pid)
        parent.kill()
    for _ in range(100):
        if not _alive(worker_pid):
            break
        time.sleep(0.1)
    assert not _alive(worker_pid)


def test_a_case_a_killed_campaign_was_running_is_reported_and_kept_by_the_next(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "difftest", "run", "--plugin", PLUGIN, "--paths"]
    command += ["bad-hang", "--device", "cpu", "--budget-s", "600", "--out", str(out)]
    campaign = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log = out / "running.jsonl"
    try:
        for _ in range(300):
            if (log.exists() and log.read_text().strip()) or campaign.poll() is not None:
                break
            time.sleep(0.1)
        assert log.exists() and log.read_text().strip(), f"exit code {campaign.poll()}"
        campaign.send_signal(signal.SIGKILL)
    finally:
        campaign.kill()
        campaign.wait()
    assert campaign.returncode == -signal.SIGKILL
    # on a CPU a campaign runs a launch per core at once (``--workers``): each begun launch's
    # cases were running
    begun = [json.loads(line) for line in log.read_text().splitlines()]
    running = [c for entry in begun if "cases" in entry for c in entry["cases"]]
    digest = Case.from_json(running[0]).digest()

    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "difftest",
            "run",
            "--paths",
            "torch-sdpa",
            "--device",
            "cpu",
            "--max-cases",
            "1",
            "--out",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    died = f"{len(running)} case(s) were running when the last run into this folder died"
    assert died in again.stdout
    assert digest in again.stdout
    kept = load_repro(out / "died" / f"{digest}.running.json")
    assert kept.status == "running" and kept.case.digest() == digest


# -- compute-sanitizer --------------------------------------------------------------------------

MEMCHECK_LOG = (ROOT / "tests" / "fixtures" / "memcheck_h200.log").read_text()
"""Real memcheck output (compute-sanitizer 2025.3.1 on an H200, ``bad-gpu-oob`` replayed
through ``run_under_sanitizer``), trimmed to two of its 16 per-thread records, the launch
failure and the summary, and to a few host frames each."""
OLD_STYLE_LOG = """\
========= CUDA-MEMCHECK
========= Invalid __global__ write of size 4
=========     at 0x000000c8 in kernel.cu:75:scatter(float*, int)
=========     by thread (9,0,0) in block (0,0,0)
=========     Address 0x000370e8 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""


def test_memcheck_records_are_parsed_in_order_without_host_frames() -> None:
    records, count = parse_sanitizer_output("the application's output\n" + MEMCHECK_LOG)
    assert count == 18
    assert [(r.kind, r.repeats) for r in records] == [
        ("Invalid __global__ read of size 2 bytes", 2),
        (
            'Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure"'
            " on CUDA API call to cudaGetLastError.",
            1,
        ),
    ]
    first = records[0]
    assert first.where == "at read_far+0xe0 in bad_paths.py:85"
    assert first.thread == "by thread (0,0,0) in block (0,0,0)"
    assert first.address == "Access to 0x81ad46839600 is out of bounds"
    assert len(first.lines) == 5
    assert not any("Host Frame" in line or "backtrace" in line for line in first.lines)
    assert parse_sanitizer_output(MEMCHECK_LOG, limit=1)[0] == records[:1]


def test_older_memcheck_output_and_a_clean_run_parse_too() -> None:
    records, count = parse_sanitizer_output(OLD_STYLE_LOG)
    assert count == 1 and len(records) == 1
    assert records[0].kind == "Invalid __global__ write of size 4"
    assert records[0].address == "Address 0x000370e8 is out of bounds"
    assert parse_sanitizer_output("========= ERROR SUMMARY: 0 errors\n") == ([], 0)


def test_without_compute_sanitizer_the_report_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(sanitizer, "DEFAULT_TOOLKIT", str(tmp_path))
    report = run_under_sanitizer(tmp_path / "any.json", [], [], timeout_s=5.0)
    assert not report.available and not report.records
    assert report.summary.startswith("compute-sanitizer is not installed")


_FAKE_SANITIZER = """\
#!/bin/sh
# Stands in for compute-sanitizer: checks its options, writes a memcheck log, runs the child.
[ "$1" = "--tool" ] && [ "$2" = "memcheck" ] && [ "$3" = "--log-file" ] || exit 9
log="$4"; shift 4
[ "$PYTORCH_NO_CUDA_MEMORY_CACHING" = "1" ] || exit 8
cat > "$log" <<'EOF'
{log}EOF
exec "$@"
"""


def test_the_repro_is_rerun_under_the_sanitizer_and_its_records_kept(tmp_path: Path) -> None:
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(_FAKE_SANITIZER.format(log=MEMCHECK_LOG))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    repro = write_repro(
        tmp_path,
        Repro(case=small_case(), status="running", paths=("good-sdpa",), plugins=(PLUGIN,)),
    )
    report = run_under_sanitizer(
        repro,
        ["good-sdpa", "torch-sdpa"],
        [PLUGIN],  # the repro's plugins are never imported: the command line names them
        timeout_s=60.0,
        device="cpu",
        sanitizer=str(fake),
    )
    assert report.available and report.returncode == 0, report.output_tail
    assert report.error_count == 18 and len(report.records) == 2
    assert report.summary == (
        "ERROR SUMMARY: 18 errors; first: Invalid __global__ read of size 2 bytes "
        "at read_far+0xe0 in bad_paths.py:85 (2 times)"
    )
    assert report.command[:4] == (str(fake), "--tool", "memcheck", "--log-file")
    assert report.result is not None
    outcomes = [(r["path"], r["outcome"]) for r in report.result["results"]]
    assert outcomes == [("good-sdpa", "AGREE"), ("torch-sdpa", "AGREE")]
    assert json.loads(json.dumps(report.to_json()))["records"][0]["kind"] == report.records[0].kind


def test_a_sanitized_child_that_overruns_is_killed(tmp_path: Path) -> None:
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(_FAKE_SANITIZER.format(log=""))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    repro = write_repro(tmp_path, Repro(case=small_case(), status="running", paths=("bad-hang",)))
    report = run_under_sanitizer(
        repro, [], [PLUGIN], timeout_s=2.5, device="cpu", sanitizer=str(fake)
    )
    assert report.timed_out and report.summary == "timed out after 2s"
    assert report.result is None and report.error_count is None


# -- the hang cap -------------------------------------------------------------------------------


def test_a_healthy_path_that_misses_the_hang_cap_once_is_rerun_not_called_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session caps warm runs at a share of the budget. On a loaded machine a healthy
    path can miss that cap once; the cut is confirmed with a rerun at 1.5 times the cap, and the
    path's real verdict is kept. A path that hangs is still a HANG after the rerun, and after
    that each cut of it is a hang at once."""
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_MARK", str(tmp_path / "slept"))
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_S", "3")
    deadline = Deadline(base_s=60.0, cold_s=0.0, grace_s=0.5)  # the cap decides, not this
    paths = resolve(["slow-once", "bad-hang", "good-sdpa"])
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=deadline) as executor:
        executor.hang_cap = 2.0  # slow-once's first call sleeps 3 s: cut once, then fine
        first = executor.evaluate(small_case())
        outcomes = {r.path: r.outcome for r in first.results}
        assert outcomes == {
            "slow-once": Outcome.AGREE,
            "bad-hang": Outcome.HANG,
            "good-sdpa": Outcome.AGREE,
        }
        assert (tmp_path / "slept").exists()  # it did sleep past the cap once
        assert executor.confirmations == 2  # one rerun for each path cut at the cap
        hang = first.result_for("bad-hang")
        assert hang is not None and "hang cap" in hang.reason
        assert hang.metrics.deadline_s == pytest.approx(3.0)  # the confirming run's limit
        assert executor.confirmed_hangs == {"bad-hang"}
        second = executor.evaluate(small_case(seed=8), only=["bad-hang"])
        assert second.results[0].outcome is Outcome.HANG
        assert executor.confirmations == 2  # a confirmed hanger gets no second rerun


def test_stopping_a_worker_whose_log_is_already_closed_raises_nothing() -> None:
    """Stopping runs on the way out of a failure (a worker that died while it started): a log
    descriptor closed already must not replace that failure with ``EBADF``."""
    from difftest.execution.isolation.worker import WorkerProcess, WorkerSettings

    worker = WorkerProcess(WorkerSettings((), ("torch-sdpa",), "cpu", None))
    os.close(worker._log_fd)
    worker.stop(0.0)
    assert worker._log_fd == -1 and not worker.process.is_alive()
    assert not Path(worker.log_path).exists()
    worker.stop(0.0)  # twice is harmless too


def test_two_threads_stopping_one_worker_stop_it_once(caplog: pytest.LogCaptureFixture) -> None:
    """A campaign's close and a launch thread's failed start can stop one worker at once; two
    threads waiting for one process misread it (one reaps it, the other's wait reports it still
    running: "did not exit after SIGKILL", Run 43's CI), so the second stop waits for the
    first and does nothing more."""
    from difftest.execution.isolation.worker import WorkerProcess, WorkerSettings

    for _ in range(3):
        worker = WorkerProcess(WorkerSettings((), ("torch-sdpa",), "cpu", None))
        stops = [
            threading.Thread(target=worker.stop, args=(1.0,), kwargs=kwargs)
            for kwargs in ({"polite": True}, {"exit_wait_s": 0.5}, {})
        ]
        for t in stops:
            t.start()
        for t in stops:
            t.join(60)
        assert not any(t.is_alive() for t in stops)
        assert worker.process.exitcode is not None and worker._log_fd == -1
    assert "did not exit" not in caplog.text


def _start_then_die(progress: Progress) -> None:
    progress.begin(7)
    progress.start("b")
    os._exit(3)


def test_the_progress_record_tells_which_path_runs_and_outlives_a_dead_worker() -> None:
    """Which message and path run is written to shared memory as they start (no message):
    the parent reads it from a worker that died in that path, with its start on the parent's
    clock; a new message starts with no path running and none started."""
    import multiprocessing

    progress = Progress.shared(3)
    progress.paths = ["a", "b", "c"]
    assert progress.read() == (0, None, 0.0, frozenset())
    before = time.monotonic()
    child = multiprocessing.get_context("spawn").Process(target=_start_then_die, args=(progress,))
    child.start()
    child.join(60)
    assert child.exitcode == 3
    message, running, since, started = progress.read()
    assert (message, running, started) == (7, "b", frozenset({"b"}))
    assert before <= since <= time.monotonic()
    progress.start("a")
    assert progress.read().running == "a" and progress.read().started == {"a", "b"}
    assert progress.started() == ["a", "b"]
    progress.begin(8)
    look = progress.read()
    assert (look.message, look.running, look.started) == (8, None, frozenset())
    assert since <= look.since <= time.monotonic()


def test_a_worker_started_with_the_session_is_the_executors_own() -> None:
    """A session told to prestart a worker starts it before it asks which paths can run here;
    the executor it then makes takes that worker (no second start) and runs cases in it."""
    from difftest.execution.session import Session, Settings

    settings = Settings(device="cpu", paths=("torch-sdpa", "torch-paged-online"), prestart=1)
    with Session(settings) as session:
        [early] = session._early.waiting
        executor = session.executor(resolve(["torch-sdpa"]))  # a subset of what it serves
        assert session._early.waiting == []
        result = executor.evaluate(small_case())
        assert isinstance(executor, IsolatedExecutor) and executor.worker_pid == early.pid
        assert executor.replacements == 0
        assert [r.outcome for r in result.results] == [Outcome.AGREE]


def test_a_prestarted_worker_no_executor_takes_is_stopped_with_the_session() -> None:
    from difftest.execution.session import Session, Settings

    settings = Settings(device="cpu", paths=("torch-sdpa",), prestart=1)
    with Session(settings) as session:
        [early] = session._early.waiting
        executor = session.executor(resolve(["torch-paged-online"]))  # not among its paths
        assert session._early.waiting == [early]
        executor.evaluate(small_case())
        assert isinstance(executor, IsolatedExecutor) and executor.worker_pid != early.pid
    assert early.exitcode(5.0) is not None


def test_a_record_left_half_written_is_read_as_it_stands() -> None:
    """A worker killed between the two halves of a write leaves the sequence number odd: the
    parent settles for what the record holds after a bounded number of looks, never spins."""
    progress = Progress.shared(2)
    progress.paths = ["a", "b"]
    progress.start("b")
    progress._cells[0] += 1  # the worker died in its next write
    assert progress.read().running == "b"


def test_a_session_that_fails_to_open_stops_its_prestarted_workers() -> None:
    """A path asked for that cannot run here refuses the session after its workers started:
    they are stopped then, not left to the parent's exit."""
    import multiprocessing

    from difftest.execution.session import Session, Settings
    from difftest.model.errors import SetupError

    before = {p.pid for p in multiprocessing.active_children()}
    settings = Settings(
        device="cpu", paths=("torch-sdpa", "fi-decode-xqa"), prestart=1, require_paths=True
    )
    with pytest.raises(SetupError, match="fi-decode-xqa was asked for but cannot run here"):
        Session(settings)
    assert {p.pid for p in multiprocessing.active_children()} - before == set()


# -- cases written ahead: run next without being sent again, withdrawn when another message goes
# first, lost with a worker that crashes, and never blamed for that crash -------------------------


@pytest.fixture
def slow_first_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``slow-once`` sleeps a second on its first call (in whichever worker makes it)."""
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_MARK", str(tmp_path / "slept"))
    monkeypatch.setenv("DIFFTEST_SLOW_ONCE_S", "1")


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
    first, second = small_case(1), small_case(2)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=PATIENT) as executor:
        assert not executor.send_ahead([second])  # nothing of ours runs: nothing written
        executor.start()
        with ThreadPoolExecutor(1) as thread:
            running = thread.submit(executor.evaluate, first)
            until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
            pid = executor.worker_pid
            behind = [small_case(seed) for seed in range(2, 2 + AHEAD_MAX)]
            assert all(executor.send_ahead([c]) for c in behind)
            assert not executor.send_ahead([small_case(99)])  # AHEAD_MAX messages ahead at most
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
    first, second, third = small_case(1), small_case(2), small_case(3)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=PATIENT) as executor:
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
    first, second = small_case(1), small_case(2)
    with IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=PATIENT) as executor:
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


def test_closing_with_a_message_written_ahead_and_never_taken_stops_the_worker_at_once(
    slow_first_call: None,
) -> None:
    """Its launch was cancelled: the worker would run a case nobody waits for, so it is
    terminated instead of asked to stop after it (which it would answer with exit code 0)."""
    paths = resolve(["slow-once", "good-sdpa"])
    executor = IsolatedExecutor(paths, "cpu", plugins=[PLUGIN], deadline=PATIENT)
    executor.start()
    with ThreadPoolExecutor(1) as thread:
        running = thread.submit(executor.evaluate, small_case(1))
        until(lambda: running_path(executor) == "slow-once", "the first case's slow path")
        assert executor.send_ahead([small_case(2)])
        running.result(timeout=60)
    worker = executor._worker
    assert worker is not None
    executor.close()
    assert worker.process.exitcode == -signal.SIGTERM


def test_closing_an_executor_with_nothing_ahead_lets_its_worker_stop_cleanly() -> None:
    executor = IsolatedExecutor(resolve(["good-sdpa"]), "cpu", plugins=[PLUGIN], deadline=PATIENT)
    executor.evaluate(small_case(1))
    worker = executor._worker
    assert worker is not None
    executor.close()
    assert worker.process.exitcode == 0


def test_a_hang_says_where_the_worker_was_stuck(
    bad_run: tuple[IsolatedExecutor, dict[str, dict[str, object]], float],
) -> None:
    """Before a hung worker is stopped it is asked for its threads' stacks (faulthandler, on
    SIGUSR1): the verdict names the innermost frame of the thread that served the case, and
    the dump is in the kept output."""
    _, by_path, _ = bad_run
    hang = by_path["bad-hang"]
    assert "; it was in _hang (fixtures/bad_paths.py:" in str(hang["reason"])
    metrics = hang["metrics"]
    assert isinstance(metrics, dict)
    output = "\n".join(metrics["worker_output"])
    assert "most recent call first" in output and "in _hang" in output


def test_the_innermost_frame_is_the_serving_threads() -> None:
    from difftest.execution.isolation import worker

    own = worker.__file__
    dump = [
        "Thread 0x00007f01 (most recent call first):",
        '  File "/usr/lib/python3.12/threading.py", line 355 in wait',
        '  File "/usr/lib/python3.12/threading.py", line 1012 in run',
        "Current thread 0x00007f00 (most recent call first):",
        '  File "/x/paths/kernel.py", line 7 in launch',
        '  File "/x/execution/evaluate.py", line 60 in run_path',
        f'  File "{own}", line 240 in _serve',
    ]
    assert worker.innermost_frame(dump) == "launch (paths/kernel.py:7)"
    assert worker.innermost_frame(dump[:3]) is None  # no thread of the worker's loop
    assert worker.innermost_frame(["a line", "another"]) is None
