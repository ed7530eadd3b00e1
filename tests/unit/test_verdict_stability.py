"""Speed never changes a verdict: a stored list of cases keeps every outcome it had.

``tests/data/verdicts.json`` holds cases (drawn once from the default CPU planner, seed 1616)
and packed launches, and each path's verdict on them as the evaluation computed it before
the throughput work of issue 16 (batched oracle, tiled paths, cheaper judging): the outcome,
its detail and which requests were wrong. The paths are the two CPU paths and a handful of
mutant kernels, so the list holds many ``WRONG`` verdicts too, not only agreements. Any
change of a stored verdict is a change of what difftest decides, and must be intended.

The wrong requests are stored when the verdict names them all (fewer than its cap of located
requests). The file is regenerated only when a verdict change is intended:

    python tests/unit/test_verdict_stability.py --write
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _interpreter import not_interpretable

from difftest.campaign.planning import CampaignConfig, Planner
from difftest.execution import packing
from difftest.execution.evaluate import evaluate, evaluate_pack
from difftest.generation import fused_store, materialize
from difftest.judgement.tolerance import MAX_LOCATED_REQUESTS
from difftest.machine import host_copy
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, ErrorLocation
from difftest.oracle import fused
from difftest.paths.registry import KernelPath, get_path, load_plugin

WHY_NOT = not_interpretable("the fused oracle's kernels")

DATA = Path(__file__).parents[1] / "data" / "verdicts.json"
SEED = 1616
CASES = 200
LAUNCHES = 16
CPU_PATHS = ("torch-sdpa", "torch-paged-online")
MUTANT_PATHS = (
    "mutant-causal-off-by-one",
    "mutant-window-edge-exclusive",
    "mutant-sinks-per-kv-head",
    "mutant-gqa-modulo",
    "mutant-partial-last-page",
    "mutant-bmm2-in-softmax",
    "mutant-split-kv-no-rescale",
)
PATHS = CPU_PATHS + MUTANT_PATHS
MUTANT_COLUMNS = 40
"""The mutants (page-by-page loops) run on the cases of at most this many page columns."""


def _paths(case: Case) -> list[KernelPath]:
    """The CPU paths, and the mutants too for a case of few page columns."""
    load_plugin("difftest.calibration.mutants")
    names = PATHS if case.table_width() <= MUTANT_COLUMNS else CPU_PATHS
    return [get_path(name) for name in names]


def _wrong_requests(errors: tuple[ErrorLocation, ...]) -> list[int] | str:
    """The wrong requests, when the verdict names them all: it locates the worst
    :data:`MAX_LOCATED_REQUESTS`, so a full list may be cut, and which near-equal requests
    make the cut is rounding, not a decision."""
    if len(errors) >= MAX_LOCATED_REQUESTS:
        return f">= {MAX_LOCATED_REQUESTS}"
    return sorted(e.request for e in errors)


def verdicts(result: CaseResult) -> dict[str, list[Any]]:
    """Per path: ``[outcome, detail, wrong requests]``."""
    return {
        r.path: [r.outcome.value, r.detail, _wrong_requests(r.metrics.errors)]
        for r in result.results
    }


def _draw() -> tuple[list[Case], list[list[Case]]]:
    cpu = torch.device("cpu")
    single = [c for _, c in itertools.islice(Planner(CampaignConfig(seed=SEED), cpu), CASES)]
    packed_plan = Planner(CampaignConfig(seed=SEED + 1, pack=4, cases_per_variant=2), cpu)
    groups = packing.group_for_launches((c for _, c in packed_plan), 4)
    launches = itertools.islice((g for g in groups if len(g) > 1), LAUNCHES)
    return single, list(launches)


def write() -> None:
    single, launches = _draw()
    data = {
        "paths": list(PATHS),
        "cases": [
            {"case": c.to_json(), "verdicts": verdicts(evaluate(c, _paths(c)))} for c in single
        ],
        "launches": [
            {
                "cases": [c.to_json() for c in group],
                "verdicts": [verdicts(r) for r in evaluate_pack(group, _paths(group[0]))],
            }
            for group in launches
        ],
    }
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _stored() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def test_the_stored_list_has_findings_as_well_as_agreements() -> None:
    stored = _stored()
    assert stored["paths"] == list(PATHS)
    assert len(stored["cases"]) == CASES and len(stored["launches"]) == LAUNCHES
    outcomes = [v[0] for e in stored["cases"] for v in e["verdicts"].values()]
    assert outcomes.count("AGREE") > 500 and outcomes.count("WRONG") > 100


def _changed_cases() -> list[str]:
    changed = []
    for n, entry in enumerate(_stored()["cases"]):
        case = Case.from_json(entry["case"])
        got = verdicts(evaluate(case, _paths(case)))
        if got != entry["verdicts"]:
            diff = {p: (entry["verdicts"].get(p), got.get(p)) for p in got}
            changed.append(f"case {n}: " + str({p: d for p, d in diff.items() if d[0] != d[1]}))
    return changed


def test_every_stored_case_keeps_its_verdicts() -> None:
    changed = _changed_cases()
    assert not changed, "verdicts changed:\n" + "\n".join(changed)


def _gpu_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's route, run here: each fused store a call of its torch form, a launch's stores
    run together at the end of its generation, the plan by one copy."""
    store = functools.partial(fused_store.one_by_one, materialize._store_torch)
    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(fused_store, "_checked", True)
    monkeypatch.setattr(fused_store, "launch", store)
    monkeypatch.setattr(host_copy, "ONE_COPY_ON_CPU", True)


def _changed_launches() -> list[str]:
    changed = []
    for n, entry in enumerate(_stored()["launches"]):
        cases = [Case.from_json(c) for c in entry["cases"]]
        got = [verdicts(r) for r in evaluate_pack(cases, _paths(cases[0]))]
        if got != entry["verdicts"]:
            changed.append(f"launch {n}")
    return changed


@pytest.mark.parametrize("route", ["cpu", "gpu"])
def test_every_stored_launch_keeps_its_verdicts(
    route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU's route and on a GPU's (:func:`_gpu_route`)."""
    if route == "gpu":
        _gpu_route(monkeypatch)
    changed = _changed_launches()
    assert not changed, "verdicts changed: " + ", ".join(changed)


@pytest.mark.slow
@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_every_stored_verdict_holds_with_the_oracle_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle a GPU runs, run here: the fused oracle's Triton kernels, under Triton's
    interpreter, judge every stored case and launch (on a GPU's route), with a GPU's block
    sizes and order of sums, and no verdict changes: the stored ones were judged by the torch
    form. A change to the kernels' shapes (what throughput work tunes) is held to the list
    here, on any machine with Triton, not only on a GPU (``ci/gpu_verdicts.py``)."""
    _gpu_route(monkeypatch)
    monkeypatch.setattr(fused, "usable", lambda device: True)
    monkeypatch.setattr(fused, "_checked", True)  # the first-use check is tested elsewhere
    runs: list[int] = []
    kernels = fused.paged_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        runs.append(1)
        return kernels(*args, **kwargs)

    monkeypatch.setattr(fused, "paged_attention", counted)
    changed = _changed_cases()
    judged_cases = len(runs)
    changed += _changed_launches()
    assert judged_cases and len(runs) > judged_cases  # the kernels judged cases and launches
    assert not changed, "verdicts changed: " + ", ".join(changed)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
