"""The runner: CPU paths agree with the oracle; failures become outcomes, not exceptions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given

import difftest
from difftest.execution.evaluate import evaluate
from difftest.generation.strategies import cases
from difftest.model.batch import Batch
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome
from difftest.paths import get_path, resolve

CPU_PATHS = ["torch-sdpa", "torch-paged-online"]


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []

    def add(name: str, fn: object, **kw: object) -> None:
        difftest.register_path(name, fn, **kw)  # type: ignore[arg-type]
        names.append(name)

    yield names
    for name in names:
        difftest.unregister(name)


def small_case(**kw: object) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=4, num_kv_heads=2, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(6, 11), q_len=3),
        **kw,  # type: ignore[arg-type]
    )


@given(cases())
def test_cpu_paths_agree_with_the_oracle(case: Case) -> None:
    result = evaluate(case, [get_path(n) for n in CPU_PATHS])
    for r in result.results:
        assert r.outcome is Outcome.AGREE, (r.path, r.reason, case.to_json())
    assert all(p.agree for p in result.pairs)


def test_exceptions_become_raised_and_wrong_shapes_too() -> None:
    def boom(batch: Batch) -> torch.Tensor:
        raise ValueError("kernel refused\nsecond line")

    def misshapen(batch: Batch) -> torch.Tensor:
        return batch.q[:1]

    difftest.register_path("t-boom", boom)
    difftest.register_path("t-shape", misshapen)
    try:
        result = evaluate(small_case(), [get_path("t-boom"), get_path("t-shape")])
    finally:
        difftest.unregister("t-boom")
        difftest.unregister("t-shape")
    boom_r, shape_r = result.results
    assert boom_r.outcome is Outcome.RAISED and boom_r.reason == "ValueError: kernel refused"
    assert (
        shape_r.outcome is Outcome.RAISED
        and "expected a tensor of shape (6, 4, 16)" in shape_r.reason
    )


def test_unsupported_paths_are_skipped_with_their_reason() -> None:
    difftest.register_path("t-picky", get_path("torch-sdpa").run, supports=lambda c, d: "no thanks")
    try:
        result = evaluate(small_case(), [get_path("t-picky")])
    finally:
        difftest.unregister("t-picky")
    assert result.results[0].outcome is Outcome.UNSUPPORTED
    assert result.results[0].reason == "no thanks"


def test_nondeterminism_is_caught_when_checked() -> None:
    calls = {"n": 0}

    def flaky(batch: Batch) -> torch.Tensor:
        calls["n"] += 1
        out = get_path("torch-sdpa").run(batch)
        if calls["n"] % 2 == 0:
            out[0, 0, 0] += out[0, 0, 0].abs() * 2**-7  # one ulp-ish: within tolerance
        return out

    difftest.register_path("t-flaky", flaky)
    try:
        plain = evaluate(small_case(), [get_path("t-flaky")])
        checked = evaluate(small_case(), [get_path("t-flaky")], check_determinism=True)
    finally:
        difftest.unregister("t-flaky")
    assert plain.results[0].outcome is Outcome.AGREE
    assert checked.results[0].outcome is Outcome.NONDETERMINISTIC
    assert checked.results[0].metrics.nondeterministic_elements == 1


def test_default_resolution_lists_builtin_paths() -> None:
    names = [p.name for p in resolve(None)]
    assert names[:2] == CPU_PATHS
    assert all("mutant" not in p.tags for p in resolve(None))
