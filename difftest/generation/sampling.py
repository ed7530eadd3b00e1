"""Draw a deterministic list of cases from a strategy, outside any test.

A campaign needs cases as data (to run, count, shard and digest), not a test body. This runs a
throw-away ``@given`` function in Hypothesis's generate phase only, seeded, with no example
database, and collects what it draws: the same seed, Hypothesis version and difftest source give
the same list. Not across source changes: Hypothesis (6.13x on) mixes literal constants it reads
from the source of loaded project modules into its draws, so an edit anywhere in difftest (or a
plugin) can change which cases a seed draws. What travels between machines and versions is the
case spec (a repro file), never a seed.
"""

from __future__ import annotations

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

    collect()
    return drawn
