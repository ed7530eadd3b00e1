"""Draw a deterministic list of cases from a strategy, outside any test.

A campaign needs cases as data (to run, count, shard and digest), not a test body. This runs a
throw-away ``@given`` function in Hypothesis's generate phase only, seeded, with no example
database, and collects what it draws: the same seed, Hypothesis version and strategies give the
same list. Hypothesis (6.13x on) also mixes literal constants it reads from the source of
loaded project modules into its draws, so that an edit anywhere in difftest (or a plugin) would
change which cases a seed draws; while it samples, this module hands Hypothesis an empty set of
local constants (:func:`_without_source_constants`; where a Hypothesis version has no such
hook the draws are still deterministic, only source-dependent again). Tests that draw cases
under ``@given`` keep Hypothesis's constants. What travels between machines and versions is
the case spec (a repro file), never a seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.strategies import SearchStrategy

from difftest.model.case import Case


def sample_cases(strategy: SearchStrategy[Case], *, seed: int, count: int) -> list[Case]:
    """Up to ``count`` distinct cases drawn from ``strategy`` with ``seed`` (in draw order)."""
    drawn: list[Case] = []
    seen: set[str] = set()

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(strategy)
    def collect(case: Case) -> None:
        digest = case.digest()
        if digest not in seen:
            seen.add(digest)
            drawn.append(case)

    with _without_source_constants():
        collect()
    return drawn


@contextlib.contextmanager
def _without_source_constants() -> Iterator[None]:
    """Hypothesis's draws without the constants it collects from local source files (a
    private hook of ``hypothesis.internal.conjecture.providers``: used only where it is
    there, and restored on the way out, the cache of permitted constants cleared both ways)."""
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # another Hypothesis layout: its draws as they come
        yield
        return
    hook = getattr(providers, "_get_local_constants", None)
    cache: Any = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if hook is None or cache is None or not hasattr(cache, "clear"):
        yield
        return
    empty = Constants()
    providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = hook
        cache.clear()
