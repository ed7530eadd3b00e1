"""``sample_cases``: a campaign's templates depend on the seed and the strategies, not on
literal constants elsewhere in the loaded source (Hypothesis mixes those into its draws)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, cases

CONSTANTS = "\n".join(f"C{i} = {v}" for i, v in enumerate([3, 7, 15, 31, 63, 127, 255, 511, 77]))


def _load(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)


def test_a_new_module_with_constants_does_not_change_what_a_seed_draws(tmp_path: Path) -> None:
    before = [c.digest() for c in sample_cases(cases(limits=CPU_LIMITS), seed=5, count=40)]
    source = tmp_path / "difftest_test_extra_constants.py"
    source.write_text(CONSTANTS + "\n")
    _load(source)  # a local module: Hypothesis would read its constants
    try:
        after = [c.digest() for c in sample_cases(cases(limits=CPU_LIMITS), seed=5, count=40)]
    finally:
        sys.modules.pop(source.stem, None)
    assert after == before


def test_tests_under_given_still_get_hypothesis_constants_after_sampling() -> None:
    """The hook is put back: after a sample, a test's integers still come from Hypothesis
    with its constants (the draw runs and is in range; the hook object is the original)."""
    from hypothesis.internal.conjecture import providers

    hook = providers._get_local_constants
    sample_cases(cases(limits=CPU_LIMITS), seed=1, count=2)
    assert providers._get_local_constants is hook

    @settings(max_examples=20, database=None)
    @given(st.integers(0, 1000))
    def inner(x: int) -> None:
        assert 0 <= x <= 1000

    inner()
