"""The worker the command line starts before it imports torch
(:mod:`difftest.execution.isolation.preload`): which commands start one, that it starts before
torch is imported, that the session's first early worker is that one and serves cases with the
same verdicts, and that nothing is left running when nothing takes it."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap

import pytest

from difftest.execution.isolation import preload
from difftest.execution.isolation.worker import (
    PRELOAD_CAPACITY,
    WorkerProcess,
    WorkerSettings,
)
from difftest.machine.cores import cpu_workers
from difftest.model.case import AttentionConfig, BatchSpec, Case


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["run"], True),
        (["bench", "--budget-s", "5"], True),
        (["run", "--isolation", "process"], True),
        (["run", "--isolation=process"], True),
        (["run", "--isolation", "none"], False),
        (["run", "--isolation=none"], False),
        (["run", "--iso", "none"], False),  # argparse accepts a unique abbreviation
        (["run", "--help"], False),
        (["bench", "-h"], False),
        (["replay", "x.repro.json"], False),
        (["selftest"], False),
        ([], False),
        (
            ["run", "--isolation"],
            True,
        ),  # its value missing: the parser refuses, the worker is stopped
    ],
)
def test_the_commands_that_start_a_worker_first(argv: list[str], wanted: bool) -> None:
    assert preload.wanted(argv) is wanted


def test_the_worker_starts_before_this_process_imports_torch() -> None:
    """What the preload is for: the console script reaches the worker's spawn with torch not
    yet imported (so the worker's imports run beside the parent's own)."""
    script = textwrap.dedent(
        """
        import sys
        from difftest.execution.isolation import preload
        preload.start(["run"])
        worker = preload.take()
        assert worker is not None and worker.process.is_alive()
        print("torch" in sys.modules)
        worker.stop(1.0)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def _case(seed: int) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=4, num_kv_heads=2, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9, 0), q_len=3),
        seed=seed,
    )


def _children() -> set[int | None]:
    return {p.pid for p in multiprocessing.active_children()}


def test_a_session_configures_the_preloaded_worker_and_gets_the_same_verdicts() -> None:
    """The session's first early worker is the preloaded one, configured by it; the cases it
    serves get the verdicts the same cases get in process."""
    from difftest.execution.executors import InProcessExecutor
    from difftest.execution.session import Session, Settings
    from difftest.paths.registry import resolve

    paths = ("torch-sdpa", "torch-paged-online")
    preload.start(["run", "--workers", "1"])
    [waiting] = preload._waiting
    assert waiting.started_for is None
    with Session(Settings(device="cpu", paths=paths, prestart=1)) as session:
        assert preload.take() is None  # the session took it
        assert session._early is not None and session._early.waiting == [waiting]
        assert waiting.started_for is not None
        assert waiting.started_for.path_names == paths
        cases = [_case(seed) for seed in range(3)]
        isolated = [session.executor().evaluate(c) for c in cases]
        assert session.executor().worker_pid == waiting.pid  # type: ignore[attr-defined]
    local = InProcessExecutor(resolve(list(paths)), session.device)
    for case, got in zip(cases, isolated, strict=True):
        want = local.evaluate(case)
        assert [(r.path, r.outcome) for r in got.results] == [
            (r.path, r.outcome) for r in want.results
        ]
        assert [r.metrics.max_abs for r in got.results] == [r.metrics.max_abs for r in want.results]
    assert waiting.exitcode(10.0) is not None


def test_an_untaken_preloaded_worker_is_stopped() -> None:
    before = _children()
    preload.start(["bench", "--workers", "2"])
    workers = list(preload._waiting)
    assert len(workers) == 2 and {w.pid for w in workers} <= _children()
    preload.discard()
    assert preload.take() is None
    assert all(w.exitcode(10.0) is not None for w in workers)
    assert _children() - before == set()


@pytest.mark.parametrize(
    ("argv", "count"),
    [
        (["run", "--workers", "3"], 3),
        (["bench", "--workers=2"], 2),
        (["run", "--work", "2"], 2),  # an abbreviation argparse accepts
        (["run", "--workers", "many"], 1),  # the parser refuses it: one worker, stopped
        (["run", "--device", "cuda"], 1),
        (["run", "--device=cuda:1"], 1),
        (["run", "--device", "cpu"], cpu_workers()),
        (["run", "--device", "cpu", "--workers", "1"], 1),
        (["run", "--isolation", "none", "--workers", "4"], 0),
        (["selftest"], 0),
        (["run", "--help"], 0),
    ],
)
def test_the_command_line_starts_as_many_workers_as_the_campaign_runs_launches_in(
    argv: list[str], count: int
) -> None:
    assert preload.count(argv) == count


def test_without_a_device_named_a_machine_without_a_visible_gpu_gets_a_worker_per_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert preload.count(["run"]) == cpu_workers()


def test_a_pooled_session_takes_every_preloaded_worker() -> None:
    preload.start(["run", "--workers", "2"])
    started = list(preload._waiting)
    assert len(started) == 2
    from difftest.execution.session import Session, Settings

    with Session(Settings(device="cpu", paths=("torch-sdpa",), prestart=2)) as session:
        assert preload.take() is None  # both taken
        assert session._early is not None
        assert session._early.waiting == started
        assert all(w.started_for is not None for w in started)
    assert all(w.exitcode(10.0) is not None for w in started)


def test_a_worker_is_configured_once_and_only_for_paths_its_record_holds() -> None:
    worker = WorkerProcess.preloading()
    try:
        too_many = tuple(f"p{i}" for i in range(PRELOAD_CAPACITY + 1))
        assert not worker.configure(WorkerSettings((), too_many, "cpu", None))
        assert worker.started_for is None
        settings = WorkerSettings((), ("torch-sdpa",), "cpu", None, 1)
        assert worker.configure(settings)
        assert not worker.configure(WorkerSettings((), ("torch-paged-online",), "cpu", None))
        assert worker.started_for == settings
        worker.wait_ready(120)
    finally:
        worker.stop(1.0, polite=True)


def test_a_preloaded_worker_told_a_bad_plugin_reports_it_at_start() -> None:
    """Configuration errors arrive after the preload, and are reported as a start-up error
    (the one line the user sees), as for a worker configured at spawn."""
    from difftest.execution.isolation.worker import WorkerError

    worker = WorkerProcess.preloading()
    worker.configure(WorkerSettings(("no_such_plugin_module_xyz",), ("torch-sdpa",), "cpu", None))
    with pytest.raises(WorkerError, match="could not start"):
        worker.wait_ready(120)
    assert worker.exitcode(10.0) is not None
