"""Reach at every tier (issue 15): a default CPU campaign draws, among its first cases, single
requests with prefixes past the split-KV thresholds kernels use and batches of 64 requests or
more, each several times. Checked on the planned cases, so no clock is involved: a default
60 s CPU run (2 cores) runs several hundred cases; the bar is set at the first 400."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from difftest.campaign.planning import CampaignConfig, Planner
from difftest.generation.modes import Modes
from difftest.generation.strategies import CPU_LIMITS, LONG_PREFIX, WIDE_REQUESTS
from difftest.paths.registry import resolve

FIRST = 400
SEVERAL = 5


def test_a_default_cpu_campaign_reaches_long_prefixes_and_wide_batches_early(
    tmp_path: Path,
) -> None:
    planner = Planner(CampaignConfig(out_dir=tmp_path), torch.device("cpu"), paths=resolve(None))
    planned = [case for _, case in itertools.islice(iter(planner), FIRST)]
    long = [c for c in planned if max(c.batch.prefix_lens) >= LONG_PREFIX]
    single_long = [c for c in long if len(c.batch.prefix_lens) == 1]
    wide = [c for c in planned if len(c.batch.prefix_lens) >= WIDE_REQUESTS]
    assert len(single_long) >= SEVERAL, [c.batch.prefix_lens for c in long]
    assert len(wide) >= SEVERAL, max(len(c.batch.prefix_lens) for c in planned)
    # and every one of them stays within the CPU tier's work bound (KV tokens x L x H_q x D;
    # Case.work counts multiply and add)
    for case in single_long + wide:
        assert case.work() <= 2 * CPU_LIMITS.max_work, case
    print(
        f"first {FIRST} planned CPU cases: {len(single_long)} single requests with a prefix "
        f">= {LONG_PREFIX} (longest {max(max(c.batch.prefix_lens) for c in planned)}), "
        f"{len(wide)} batches of >= {WIDE_REQUESTS} requests"
    )


def test_a_packed_ragged_campaign_is_mostly_ragged_where_it_can_be(tmp_path: Path) -> None:
    """``--ragged`` at the GPU's packing (12 cases a variant, 8 a launch): the partners of a
    ragged case are ragged too, so ragged batches are not one case among seven uniform ones
    (Run 11 on the H200 found 3 of 56 cases ragged before). Every launch the planner forms
    keeps one launch-wide key."""
    config = CampaignConfig(
        out_dir=tmp_path, modes=Modes(ragged=True), cases_per_variant=12, pack=8, seed=3
    )
    planner = Planner(config, torch.device("cpu"), paths=resolve(None))
    planned = [case for _, case in itertools.islice(iter(planner), 240)]
    can = [c for c in planned if len(c.batch.prefix_lens) >= 2 and c.batch.q_len >= 2]
    ragged = [c for c in can if c.batch.is_ragged]
    assert len(can) >= 40, len(can)
    assert len(ragged) >= 0.3 * len(can), (len(ragged), len(can))
    print(f"ragged campaign, first 240 planned: {len(ragged)} of {len(can)} that can be ragged")
