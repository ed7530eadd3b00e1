"""A launch that checks determinism measures the noise floors only when a verdict needs them.

A determinism check reruns each path and compares the two outputs' bits. Until Run 32 a
launch holding a checked case measured the noise floors first (the oracle's float32 passes
over the whole launch, the torch form's on a GPU), so that settling the launch could not
judge again a verdict the rerun had made: with ``determinism_every = 16`` and launches of 8,
half of a GPU campaign's launches. Now the rerun's outcome is laid over the settled verdict
(``bounds.apply_reruns``), so a checked launch measures the floors only when a verdict is
over its allowance, as any other launch, and gives the verdicts it gave before.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _planted import one_torch_thread  # noqa: F401  (autouse: one torch thread)

import difftest
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import bounds, packing
from difftest.execution.evaluate import evaluate_pack
from difftest.judgement import tolerance
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import Outcome
from difftest.paths import get_path, resolve, unregister

CPU_PATHS = ("torch-sdpa", "torch-paged-online")


def _launches(count: int, seed: int) -> list[list[Case]]:
    """The first ``count`` launches of four cases a packed CPU campaign plans."""
    config = CampaignConfig(seed=seed, pack=4, cases_per_variant=2)
    planned = (case for _, case in planned_cases(config, "cpu"))
    groups = (g for g in packing.group_for_launches(planned, 4) if len(g) > 1)
    return list(itertools.islice(groups, count))


@pytest.fixture
def floors(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """How often the oracle ran, how often it measured the noise floors (float32 passes,
    first or when settling), and for each case digest how often settling measured them on
    that case's batch (``"settled <digest>"``)."""
    seen: collections.Counter[str] = collections.Counter()
    first, later = tolerance.oracle_outputs, tolerance.low_outputs

    def oracle_outputs(batch: Batch, wanted: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = set(wanted)
        seen["oracle"] += 1
        seen["floors"] += bool(wanted)
        return first(batch, wanted, *args, **kwargs)

    def low_outputs(batch: Batch, precisions: Any, *args: Any, **kwargs: Any) -> Any:
        seen["floors"] += 1
        seen["settled " + batch.case.digest()] += 1
        return later(batch, precisions, *args, **kwargs)

    monkeypatch.setattr(tolerance, "oracle_outputs", oracle_outputs)
    monkeypatch.setattr(tolerance, "low_outputs", low_outputs)
    return seen


@pytest.fixture
def odd_paths() -> Iterator[list[str]]:
    """Two planted paths: one whose every second call moves one element by a fraction of its
    tolerance (NONDETERMINISTIC when checked), one that scales a long request's rows by 1.5
    (WRONG)."""
    calls = {"n": 0}

    def flaky(batch: Batch) -> torch.Tensor:
        calls["n"] += 1
        out = get_path("torch-sdpa").run(batch)
        if calls["n"] % 2 == 0:
            out[0, 0, 0] += out[0, 0, 0].abs() * 2**-7
        return out

    def wrong(batch: Batch) -> torch.Tensor:
        out = get_path("torch-sdpa").run(batch)
        long = (batch.seq_lens.long() - batch.q_len >= 40).repeat_interleave(batch.q_len)
        return torch.where(long.view(-1, 1, 1), out * 1.5, out).to(out.dtype)

    difftest.register_path("t-flaky-floors", flaky)
    difftest.register_path("t-wrong-floors", wrong)
    try:
        yield ["t-flaky-floors", "t-wrong-floors"]
    finally:
        unregister("t-flaky-floors")
        unregister("t-wrong-floors")


def test_a_checked_launch_that_agrees_measures_no_floors(
    floors: collections.Counter[str],
) -> None:
    paths = resolve(CPU_PATHS)
    groups = _launches(3, seed=7)
    for group in groups:
        for result in evaluate_pack(group, paths, check_determinism=True):
            assert [r.outcome for r in result.results] == [Outcome.AGREE] * len(paths)
    assert floors["oracle"] == len(groups)
    assert floors["floors"] == 0  # before Run 32: one a launch


def test_checked_launches_give_the_verdicts_of_floors_measured_first(
    floors: collections.Counter[str],
    odd_paths: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every outcome and reason, the rerun's and the settled judgement's, is the one the
    launch gave when it measured the floors first (the rule before Run 32, restored here by
    making every case ask for them first), on launches with a nondeterministic path, a wrong
    one and agreeing ones."""
    paths = resolve([*CPU_PATHS, *odd_paths])
    seen: collections.Counter[Outcome] = collections.Counter()
    for group in _launches(4, seed=11):
        now = evaluate_pack(group, paths, check_determinism=True)
        with monkeypatch.context() as first:
            first.setattr(bounds, "floors_first", lambda member: True)
            before = evaluate_pack(group, paths, check_determinism=True)
        for mine, theirs in zip(now, before, strict=True):
            assert [(r.path, r.outcome, r.reason) for r in mine.results] == [
                (r.path, r.outcome, r.reason) for r in theirs.results
            ]
            seen.update(r.outcome for r in mine.results)
    assert seen[Outcome.NONDETERMINISTIC] >= 4 and seen[Outcome.WRONG] >= 1
    assert seen[Outcome.AGREE] >= 8
    # the floors-first runs measured them once a launch; settling measured them on the
    # failing cases' own batches, never on the launch's (whose digest is no case's)
    digests = {case.digest() for group in _launches(4, seed=11) for case in group}
    settled = {k.split()[1]: n for k, n in floors.items() if k.startswith("settled ")}
    assert settled and set(settled) <= digests
    assert sum(settled.values()) == floors["floors"] - 4


@pytest.fixture
def some_requests_wrong() -> Iterator[str]:
    """A planted path that scales the rows of each request whose length is a multiple of 5
    by 1.5: in a packed launch some cases have such a request (WRONG) and some not."""

    def wrong(batch: Batch) -> torch.Tensor:
        out = get_path("torch-sdpa").run(batch)
        hit = (batch.seq_lens.long() % 5 == 0).repeat_interleave(batch.q_len)
        return torch.where(hit.view(-1, 1, 1), out * 1.5, out).to(out.dtype)

    difftest.register_path("t-some-requests-wrong", wrong)
    try:
        yield "t-some-requests-wrong"
    finally:
        unregister("t-some-requests-wrong")


def test_a_launch_measures_the_floors_of_its_failing_cases_alone(
    floors: collections.Counter[str], some_requests_wrong: str
) -> None:
    """Settling a launch measures the noise floors once for each case over its allowance,
    on that case's own batch: the partners that agree are not measured (until Run 48 the
    whole launch was), and each case's verdicts are the ones it gets alone."""
    paths = resolve([*CPU_PATHS, some_requests_wrong])
    mixed = 0
    for group in _launches(6, seed=1):
        floors.clear()
        packed = evaluate_pack(group, paths)
        failing = {
            r.case_digest for r in packed if any(p.outcome is not Outcome.AGREE for p in r.results)
        }
        settled = {k.split()[1]: n for k, n in floors.items() if k.startswith("settled ")}
        assert set(settled) == failing and all(n == 1 for n in settled.values())
        for case, mine in zip(group, packed, strict=True):
            alone = evaluate_pack([case], paths)[0]
            assert [(r.outcome, r.reason) for r in mine.results] == [
                (r.outcome, r.reason) for r in alone.results
            ]
        mixed += 0 < len(failing) < len(group)
    assert mixed >= 2  # launches where some cases failed and the others agreed
