"""The campaign as shard items: what ``pytest -n auto`` spreads over workers (and GPUs).

The difftest pytest plugin parametrises this test into ``shard-000`` ... (``--difftest-shards``,
default from the profile); each item runs its deterministic share of the campaign over every
registered path and fails with the findings' one-line reasons and repro files. Select or skip
them with ``-m difftest`` / ``-m "not difftest"``; size them with ``--difftest-profile``.
"""

from __future__ import annotations

from typing import Any


def test_campaign(difftest_shard: Any) -> None:
    result = difftest_shard.check()
    plan = difftest_shard.plan()
    if plan.budget_s is None:
        # A derandomised shard (no wall clock) runs exactly its share of the case list.
        assert all(len(run.cases) == plan.planned() for run in result.runs)
