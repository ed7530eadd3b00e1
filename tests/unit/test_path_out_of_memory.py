"""A path that runs out of memory is not a finding against its kernel.

On an H100 a warm campaign with eight workers (each held to its share of the device) recorded
one case as three new groups, ``fi-decode-xqa``, ``fi-decode-wrapper`` and ``fi-prefill-fa2``
each ``RAISED OutOfMemoryError`` (docs/validation.md, Run 37): a path's allocation past the
worker's share had become the path's verdict. Running out of memory inside a path is now what
it is anywhere else in a case's evaluation: the launch's cases are judged alone, a case alone
runs once more after the cache is given back, and a case that never fits is a one-line
:class:`~difftest.machine.memory.DeviceMemoryError`. Checked here with a path that raises
torch's or Triton's out-of-memory error a given number of times, in an isolated worker and in
this process; an exception that only mentions memory stays the path's ``RAISED`` verdict.
"""

from __future__ import annotations

import itertools
import json
import runpy
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from _planted import one_torch_thread  # noqa: F401  (autouse: one torch thread)

import difftest
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import graph_replay, packing
from difftest.execution.evaluate import evaluate
from difftest.execution.executors import InProcessExecutor
from difftest.execution.isolation import DeviceMemoryError, IsolatedExecutor
from difftest.machine.memory import unfitted_count, unfitted_reason
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec
from difftest.model.errors import DifftestError
from difftest.model.graph_spec import GraphSpec
from difftest.model.outcome import CaseResult, Outcome
from difftest.paths import get_path

PLUGIN = """
import torch
import difftest
from difftest.paths import get_path

sdpa = get_path("torch-sdpa")
calls = [0]


def run(batch):
    # the runs numbered n (from 1) for which {fails} find no memory; the rest are torch-sdpa's;
    # each run's request count is written to {log!r}
    calls[0] += 1
    n = calls[0]
    with open({log!r}, "a") as f:
        f.write(f"{{batch.seq_lens.numel()}}\\n")
    if {fails}:
        raise {error}({message!r})
    return sdpa.run(batch)


difftest.register_path("t-oom", run, sdpa.supports, precision=sdpa.precision)
"""

TORCH_OOM = ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.10 GiB (planted)")
TRITON_OOM = ("RuntimeError", "Triton Error [CUDA]: out of memory")
NOT_MEMORY = ("ValueError", "kernel refused: out of memory (planted, not an allocation)")
ONCE, ALWAYS = "n == 1", "True"


def plugin(tmp_path: Path, error: tuple[str, str], fails: str) -> str:
    """A plugin registering ``t-oom``, whose ``n``-th run raises ``error`` where the Python
    expression ``fails`` (of ``n`` and the ``batch``) holds; it writes each run's request
    count to ``tmp_path / "runs.txt"``."""
    name, message = error
    path = tmp_path / f"oom_path_{abs(hash(fails))}.py"
    log = str(tmp_path / "runs.txt")
    path.write_text(PLUGIN.format(error=name, message=message, fails=fails, log=log))
    return str(path)


@pytest.fixture(name="registered")
def _registered() -> Iterator[None]:
    """``t-oom``, which a test registers in this process by running its plugin, taken out
    after it (a worker imports the plugin file itself)."""
    yield
    difftest.unregister("t-oom")


def a_launch(size: int = 3, seed: int = 6) -> list[Case]:
    config = CampaignConfig(seed=seed, pack=size, cases_per_variant=2)
    planned = (case for _, case in planned_cases(config, "cpu"))
    for group in packing.group_for_launches(planned, size):
        if len(group) == size:
            return group
    raise AssertionError("the planner stopped")


def verdicts(result: CaseResult) -> list[tuple[str, Outcome, str]]:
    return [(r.path, r.outcome, r.reason) for r in result.results]


def alone(case: Case) -> list[tuple[str, Outcome, str]]:
    """What ``t-oom`` gets when memory never runs out: torch-sdpa's verdict, under its name."""
    want = evaluate(case, [get_path("torch-sdpa")])
    return [("t-oom", r.outcome, r.reason) for r in want.results]


@contextmanager
def executor(where: str, source: str) -> Iterator[InProcessExecutor | IsolatedExecutor]:
    """An executor of ``t-oom`` in a worker that imports ``source``, or in this process."""
    if where == "process":
        yield InProcessExecutor([get_path("t-oom")], torch.device("cpu"))
        return
    with IsolatedExecutor([get_path("t-oom")], "cpu", plugins=[source]) as isolated:
        yield isolated


@pytest.mark.parametrize(
    ("where", "error"),
    [("worker", TORCH_OOM), ("worker", TRITON_OOM), ("process", TORCH_OOM)],
    ids=["worker-torch", "worker-triton", "process-torch"],
)
def test_a_path_out_of_memory_once_gets_each_case_its_verdict_alone(
    tmp_path: Path, where: str, error: tuple[str, str], registered: None
) -> None:
    """A launch fails in ``t-oom`` once: every case's verdict is its verdict alone (before,
    the launch's cases were each ``RAISED``)."""
    source = plugin(tmp_path, error, ONCE)
    runpy.run_path(source)  # t-oom in this process too, for its name and options
    group = a_launch()
    with executor(where, source) as running:
        got = running.evaluate_pack(group)
    assert [verdicts(r) for r in got] == [alone(c) for c in group]


def test_a_launch_that_does_not_fit_is_not_sent_again_its_cases_run_alone_once(
    tmp_path: Path, registered: None
) -> None:
    """A worker's launch that runs out of memory at its share would do so again: the parent
    judges its cases alone, once each, instead of sending the launch a second time (on an
    H100, eight workers at their shares ran out of memory on 6-8 % of their messages,
    docs/validation.md Run 45)."""
    group = a_launch(size=3)
    sizes = [len(c.batch.prefix_lens) + c.batch.padding_requests for c in group]
    # a launch of more requests than its largest case finds no memory however often it is sent
    source = plugin(tmp_path, TORCH_OOM, f"batch.seq_lens.numel() > {max(sizes)}")
    runpy.run_path(source)  # t-oom in this process too, for its name and options
    with IsolatedExecutor([get_path("t-oom")], "cpu", plugins=[source]) as running:
        got = running.judge_pack(group)
    runs = [int(line) for line in (tmp_path / "runs.txt").read_text().split()]
    assert runs == [sum(sizes), *sizes]  # the launch once, then each case alone
    assert [verdicts(packed) for packed, _ in got] == [alone(c) for c in group]
    assert [again for _, again in got] == [None] * len(group)


def test_an_in_process_case_that_never_fits_is_a_clear_error(
    tmp_path: Path, registered: None
) -> None:
    runpy.run_path(plugin(tmp_path, TRITON_OOM, ALWAYS))
    case = a_launch()[0]
    executor = InProcessExecutor([get_path("t-oom")], torch.device("cpu"))
    with pytest.raises(DeviceMemoryError) as raised:
        executor.evaluate(case)
    assert isinstance(raised.value, DifftestError)
    message = str(raised.value)
    assert "\n" not in message and case.digest() in message and "out of memory" in message


def test_an_isolated_case_that_never_fits_is_a_clear_error(
    tmp_path: Path, registered: None
) -> None:
    source = plugin(tmp_path, TORCH_OOM, ALWAYS)
    runpy.run_path(source)
    case = a_launch()[0]
    with IsolatedExecutor([get_path("t-oom")], "cpu", plugins=[source]) as executor:
        with pytest.raises(DeviceMemoryError) as raised:
            executor.evaluate(case)
    assert case.digest() in str(raised.value)


def test_an_exception_that_only_mentions_memory_is_still_the_paths_verdict(
    tmp_path: Path, registered: None
) -> None:
    runpy.run_path(plugin(tmp_path, NOT_MEMORY, ALWAYS))
    case = a_launch()[0]
    result = evaluate(case, [get_path("t-oom")])
    assert verdicts(result) == [("t-oom", Outcome.RAISED, f"ValueError: {NOT_MEMORY[1]}")]


def test_in_a_campaigns_session_a_case_that_never_fits_is_not_run(
    tmp_path: Path, registered: None
) -> None:
    """A campaign drew the case itself: one that never fits is ``UNSUPPORTED`` on every path,
    with the reason, and the campaign goes on (in process and in a worker alike)."""
    source = plugin(tmp_path, TRITON_OOM, ALWAYS)
    runpy.run_path(source)
    case = a_launch()[0]
    local = InProcessExecutor([get_path("t-oom")], torch.device("cpu"), skip_unfitting=True)
    with IsolatedExecutor(
        [get_path("t-oom")], "cpu", plugins=[source], skip_unfitting=True
    ) as isolated:
        got = [local.evaluate(case), isolated.evaluate(case), *isolated.evaluate_pack([case])]
    reason = unfitted_reason(torch.device("cpu"))
    for result in got:
        assert result.case_digest == case.digest()
        assert verdicts(result) == [("t-oom", Outcome.UNSUPPORTED, reason)]
        assert not result.findings()


def test_a_campaign_counts_the_cases_that_never_fit_among_the_skips(tmp_path: Path) -> None:
    """``difftest run`` with a path that runs out of memory on every run of about one case in
    forty (chosen by the case's digest, so the same cases whichever worker or launch runs
    them): it runs to its budget (exit 0, no error), records no finding against the path, and
    its report counts those cases among the path's skips with the reason, and says how many in
    a line of their own."""
    source = tmp_path / "oom_some_cases.py"
    source.write_text(SOME_CASES)
    report = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "difftest", "run", "--plugin", str(source), "--paths",
         "t-oom,torch-sdpa", "--device", "cpu", "--max-cases", "300", "--budget-s", "120",
         "--no-shrink", "--out", str(tmp_path / "out"), "--json", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["cases"] == 300 and not data["groups"]
    skipped = data["paths"]["t-oom"]["skip_reasons"]
    assert skipped.get(unfitted_reason(torch.device("cpu")), 0) >= 1, skipped
    assert "does not fit" not in done.stderr
    count = unfitted_count(skipped)
    drawn = itertools.islice(planned_cases(CampaignConfig(seed=0), "cpu"), 300)
    assert count == sum(int(case.digest(), 16) % 40 == 0 for _, case in drawn) > 0
    assert f"{count} case(s) not run for lack of memory" in done.stdout, done.stdout[-1500:]


SOME_CASES = """
import torch
import difftest
from difftest.paths import get_path

sdpa = get_path("torch-sdpa")


def run(batch):
    # the cases whose digest is 0 modulo 40 never fit, however often they run
    if int(batch.case.digest(), 16) % 40 == 0:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.10 GiB (planted)")
    return sdpa.run(batch)


difftest.register_path("t-oom", run, sdpa.supports, precision=sdpa.precision)
"""


def test_a_graph_replay_out_of_memory_is_not_a_finding_of_the_graph(
    tmp_path: Path, registered: None
) -> None:
    """A graph case's replay (the path's second call) that finds no memory is run again with
    the case, not the path's ``RAISED`` verdict ("graph replay: OutOfMemoryError")."""
    runpy.run_path(plugin(tmp_path, TORCH_OOM, "n == 2"))
    graph_replay.clear()
    case = Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=2, padding_requests=1),
        pool=PoolSpec(page_order="shuffled"),
        seed=11,
        graph=GraphSpec(extra_requests=2, extra_columns=3, extra_pages=4, seed=7),
    )
    try:
        got = InProcessExecutor([get_path("t-oom")], torch.device("cpu")).evaluate(case)
    finally:
        graph_replay.clear()
    assert [(r.path, r.outcome) for r in got.results] == [("t-oom", Outcome.AGREE)], got
