"""Isolation never changes a verdict: the stored cases of ``tests/data/verdicts.json`` (see
``test_verdict_stability.py``) judged in the isolated worker keep every stored verdict, and the
worker computes with its parent's torch thread count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _planted import one_torch_thread  # noqa: F401  (autouse: one torch thread)
from test_verdict_stability import PATHS, _paths, _stored, verdicts

from difftest.execution.isolation import IsolatedExecutor
from difftest.model.case import Case
from difftest.paths.registry import get_path, load_plugin

MUTANTS = "difftest.calibration.mutants"
THREADS_PLUGIN = str(Path(__file__).resolve().parents[1] / "fixtures" / "reports_threads.py")


def test_stored_cases_and_launches_keep_their_verdicts_in_the_isolated_worker() -> None:
    load_plugin(MUTANTS)
    stored = _stored()
    changed = []
    with IsolatedExecutor([get_path(n) for n in PATHS], "cpu", plugins=[MUTANTS]) as executor:
        for n, entry in enumerate(stored["cases"]):
            case = Case.from_json(entry["case"])
            only = [p.name for p in _paths(case)]
            got = verdicts(executor.evaluate(case, only=only))
            if got != entry["verdicts"]:
                changed.append(f"case {n}: stored {entry['verdicts']}, isolated {got}")
        for n, entry in enumerate(stored["launches"]):
            cases = [Case.from_json(c) for c in entry["cases"]]
            only = [p.name for p in _paths(cases[0])]
            got_pack = [verdicts(r) for r in executor.evaluate_pack(cases, only=only)]
            if got_pack != entry["verdicts"]:
                changed.append(f"launch {n}")
        assert executor.replacements == 0
    assert not changed, "verdicts changed in the worker:\n" + "\n".join(changed)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_worker_computes_with_its_parents_torch_thread_count(threads: int) -> None:
    load_plugin(THREADS_PLUGIN)
    case = Case.from_json(_stored()["cases"][0]["case"])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        path = get_path("reports-threads")
        with IsolatedExecutor([path], "cpu", plugins=[THREADS_PLUGIN]) as executor:
            [result] = executor.evaluate(case).results
    finally:
        torch.set_num_threads(before)
    assert result.reason == f"RuntimeError: torch threads {threads}"
