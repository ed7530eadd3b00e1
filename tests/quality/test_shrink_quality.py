"""Shrink quality: a campaign finds a planted bug and shrinks it to exactly what the bug needs.

The bug (``planted-page-stride`` in ``tests/fixtures/planted.py``): for requests with index >= 1,
the draft rows (query row >= 1) read the prefix tokens of page column 1 from column 0's page. By
its definition it shows only with two requests (the first is irrelevant, so its prefix shrinks
to 0), a second prefix of at least ``page_size + 1`` (one prefix token on column 1) and
``L >= 2``. The shrunk repro must be exactly that, within a bounded number of runs, and replay
bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _planted import (  # noqa: F401  (fixtures: autouse one torch thread, planted)
    campaign,
    cpu_session,
    import_planted,
    one_torch_thread,
    planted_fixture,
)

from difftest.campaign.report import CampaignReport
from difftest.execution.evaluate import evaluate
from difftest.model.case import BatchSpec, CausalDraft
from difftest.model.outcome import Outcome
from difftest.paths import get_path
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import load_repro
from difftest.records.schemas import load_schema, validate

MAX_SHRINK_RUNS = 75
"""Runs the shrink may spend (the original's rerun included); 52 when this test was written.
It depends on the first finding, so on the plan: for seeds 0-3, 70, 75, 48 and 53 runs with
every CPU template from Hypothesis, 72, 41, 67 and 39 with seeded templates (one in 16 or 32
from Hypothesis: each first finding comes before the second Hypothesis template)."""
CPU = torch.device("cpu")


def campaign_until_first_finding(out: Path, path: str, seed: int = 0) -> CampaignReport:
    return campaign(out, ("torch-sdpa", path), seed=seed, shrink_runs=500)


@pytest.fixture(scope="module")
def page_stride(tmp_path_factory: pytest.TempPathFactory) -> CampaignReport:
    """One campaign (seed 0) that finds the page-stride bug, shared by the tests below."""
    module = import_planted()
    module.register_all()
    try:
        return campaign_until_first_finding(tmp_path_factory.mktemp("c"), module.PAGE_STRIDE)
    finally:
        module.unregister_all()


def test_the_shrunk_repro_has_exactly_what_the_planted_bug_needs(
    page_stride: CampaignReport, planted: ModuleType
) -> None:
    report = page_stride
    [group] = report.groups
    assert (group.path, group.kind) == (planted.PAGE_STRIDE, Outcome.WRONG)
    assert all(f.group == group.id for f in report.findings)
    # the features it needs: a second request, a prefix past page 0 (prefix > 1 with the
    # two-token pages it shrinks to: ps + 1 = 3 tokens), a draft row
    assert group.trigger == ("L>1", "prefix>1", "requests>1")
    assert group.minimal is not None
    file = Path(group.minimal)
    assert validate(json.loads(file.read_text()), load_schema("repro")) == []
    repro = load_repro(file)
    case = repro.case
    ps = case.attention.page_size

    assert case.batch == BatchSpec(
        mode=case.batch.mode, prefix_lens=(0, ps + 1), q_len=2, draft=CausalDraft()
    )
    info = repro.shrink
    assert info is not None and info.reproduced is True
    assert info.runs <= MAX_SHRINK_RUNS
    assert info.original_size > info.shrunk_size == case.size()
    assert info.original_digest == report.findings[0].case_digest != case.digest()
    # both paths' verdicts on the shrunk case are in the repro
    assert repro.result is not None
    recorded = {r.path: r.outcome.value for r in repro.result.results}
    assert recorded == {"torch-sdpa": "AGREE", planted.PAGE_STRIDE: "WRONG"}
    location = repro.to_json()["location"]
    assert [(e["request"], e["rows"], e["prefix_len"]) for e in location] == [(1, [1], ps + 1)]

    # Minimal by the bug's definition: each neighbour one step smaller passes.
    path = get_path(planted.PAGE_STRIDE)
    neighbours = {
        "one prefix token less": (0, ps),
        "the first request dropped": (ps + 1,),
    }
    for why, lens in neighbours.items():
        smaller = case.replace(batch=BatchSpec(mode=case.batch.mode, prefix_lens=lens, q_len=2))
        verdict = evaluate(smaller, [path]).results[0]
        assert verdict.outcome is Outcome.AGREE, why
    one_row = case.replace(batch=BatchSpec(mode=case.batch.mode, prefix_lens=(0, ps + 1), q_len=1))
    assert evaluate(one_row, [path]).results[0].outcome is Outcome.AGREE


def test_replay_reproduces_the_error_bit_for_bit_and_says_fixed_once_the_bug_is_gone(
    page_stride: CampaignReport, planted: ModuleType
) -> None:
    file = Path(page_stride.groups[0].minimal or "")
    repro = load_repro(file)
    recorded = repro.path_result()
    assert recorded is not None

    with cpu_session((planted.PAGE_STRIDE,)) as session:
        [again] = replay_repro(repro, session, source=str(file))
    assert again.verdict is Verdict.STILL_FAILS
    assert again.same_metrics is True
    assert again.result is not None
    assert again.result.metrics.same_as(recorded.metrics)
    assert again.result.metrics.max_abs == recorded.metrics.max_abs

    planted.unregister_all()
    planted.register_planted(planted.PAGE_STRIDE, planted.run_correct, "the bug, fixed")
    with cpu_session((planted.PAGE_STRIDE,)) as session:
        [fixed] = replay_repro(repro, session, source=str(file))
    assert fixed.verdict is Verdict.FIXED
    assert "fixed: planted-page-stride: agrees (was WRONG)" in fixed.line()


def test_a_window_bug_shrinks_to_one_row_that_sees_one_key_too_many(
    tmp_path: Path, planted: ModuleType
) -> None:
    report = campaign_until_first_finding(tmp_path, planted.WINDOW)
    repro = load_repro(report.groups[0].minimal or "")
    a, b = repro.case.attention, repro.case.batch
    # window 0 and one prefix token: the row at position 1 wrongly sees key 0
    assert (a.window_left, b.prefix_lens, b.q_len) == (0, (1,), 1)
    assert (a.num_qo_heads, a.num_kv_heads, a.head_dim, a.sinks) == (1, 1, 16, False)
