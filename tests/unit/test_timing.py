"""The time split's helpers: profiler ranges only while a profiler runs, shares by rows."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.profiler import profile

from difftest.execution import timing
from difftest.execution.evaluate import evaluate
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.paths.registry import get_path


def _case(prefixes: tuple[int, ...] = (5, 9)) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=prefixes, q_len=3),
    )


def test_a_phase_is_no_range_without_a_profiler_and_a_range_with_one() -> None:
    assert isinstance(timing.phase("oracle"), contextlib.nullcontext)
    with profile() as prof:
        evaluate(_case(), [get_path("torch-sdpa")], "cpu")
    names = {e.key for e in prof.key_averages() if e.key.startswith("difftest.")}
    assert {"difftest.generate", "difftest.oracle", "difftest.path torch-sdpa"} <= names


@dataclasses.dataclass
class _Member:
    case: Case
    timings: dict[str, float]


def test_a_launchs_time_is_shared_by_query_rows() -> None:
    one, three = _Member(_case((5,)), {}), _Member(_case((5, 6, 7)), {"oracle": 1.0})
    timing.share([one, three], "oracle", 8.0)
    assert one.timings == {"oracle": 2.0} and three.timings == {"oracle": 7.0}


def test_a_paths_clock_starts_after_the_devices_queue_is_drained(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Work queued before a path (a packed batch's copies, on a GPU) is not the path's time:
    the queue is drained before its clock starts, and again before it stops."""
    from difftest.execution import evaluate as evaluate_module
    from difftest.generation.materialize import materialize

    events: list[str] = []
    monkeypatch.setattr(timing, "sync", lambda device: events.append("sync"))
    path = get_path("torch-sdpa")

    class Recorded:
        name = path.name

        def __getattr__(self, attribute: str) -> object:
            return getattr(path, attribute)

        def run(self, batch):  # type: ignore[no-untyped-def]
            events.append("run")
            return path.run(batch)

    out, _ = evaluate_module.run_path(Recorded(), materialize(_case(), "cpu"))  # type: ignore[arg-type]
    assert out is not None and events == ["sync", "run", "sync"]


def test_a_paths_preparation_is_booked_as_arguments_not_as_its_kernel(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What a path does in ``preparing`` (its arguments built and checked, on difftest's
    behalf) leaves its seconds and the campaign's kernel time, and shows as ``arguments``."""
    import time

    from difftest.paths.preparation import preparing

    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    path = get_path("torch-sdpa")

    class Prepared:
        name = path.name

        def __getattr__(self, attribute: str) -> object:
            return getattr(path, attribute)

        def run(self, batch):  # type: ignore[no-untyped-def]
            with preparing(batch.device):
                now[0] += 3.0  # the arguments
            now[0] += 2.0  # the kernel
            return path.run(batch)

    result = evaluate(_case(), [Prepared()], "cpu")  # type: ignore[list-item]
    [ran] = result.results
    assert ran.seconds == 2.0
    assert result.timings["kernels"] == 2.0 and result.timings["arguments"] == 3.0


def test_preparation_that_raises_is_still_taken_out_of_the_path(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A contract violation raised while preparing: the path is RAISED, and the time it spent
    preparing is still not its kernel's."""
    import time

    from difftest.execution import evaluate as evaluate_module
    from difftest.generation.materialize import materialize
    from difftest.paths.preparation import preparing

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    path = get_path("torch-sdpa")

    class Refused:
        name = path.name

        def __getattr__(self, attribute: str) -> object:
            return getattr(path, attribute)

        def run(self, batch):  # type: ignore[no-untyped-def]
            now[0] += 1.0
            with preparing(batch.device):
                now[0] += 4.0
                raise ValueError("block_tables[0, 1] = -1: a page id in [0, 4)")

    spent: dict[str, float] = {}
    out, ran = evaluate_module.run_path(Refused(), materialize(_case(), "cpu"), spent)  # type: ignore[arg-type]
    assert out is None and ran.outcome.value == "RAISED" and "page id" in ran.reason
    assert ran.seconds == 1.0 and spent == {"arguments": 4.0}


def test_a_launchs_cases_are_queued_then_waited_for_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Generation waits for the device once per launch, after every case is queued (on a GPU
    the host queues a case while the device writes the one before), and that wait is shared
    by the elements each case writes. The clock is a fake one: queueing a case takes 1 ms of
    it, the wait 0.5 s."""
    import types

    from difftest.execution import evaluate as evaluate_module

    now = [0.0]
    events: list[str] = []
    real = evaluate_module.materialize

    def queued(case, device, pool=None, queries=None, plan=None):  # type: ignore[no-untyped-def]
        events.append("materialize")
        now[0] += 0.001
        return real(case, device, pool=pool, queries=queries, plan=plan)

    def drained(device) -> None:  # type: ignore[no-untyped-def]
        events.append("sync")
        now[0] += 0.5

    monkeypatch.setattr(evaluate_module, "materialize", queued)
    monkeypatch.setattr(evaluate_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(timing, "sync", drained)
    small, large = _case((4,)), _case((400,))
    members = [evaluate_module.Member(c, None, None, {}, [], {}, {}, None) for c in (small, large)]  # type: ignore[arg-type]
    evaluate_module._materialize(members, torch.device("cpu"))
    assert events == ["materialize", "materialize", "sync"]
    elements = [evaluate_module._elements(c) for c in (small, large)]
    assert elements[1] > 5 * elements[0]
    for m, size in zip(members, elements, strict=True):
        want = 0.001 + 0.5 * size / sum(elements)
        assert m.timings["generate"] == pytest.approx(want, rel=1e-12)
        assert m.batch is not None and m.batch.case == m.case
