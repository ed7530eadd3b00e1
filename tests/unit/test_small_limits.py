"""``--limits small``: FlashInfer's ``test_xqa_batch_decode`` shape, and nothing else.

Its first parametrisation is 4 requests, ``L = 4``, pages of 64, 4 KV heads of group 2, head
dim 128, bf16, at most 110 tokens in the cache before the new ones, with and without a window
of 127 and sinks. Every case the small limits draw (templates, runtime variations, launch
partners) has that shape, and the limits leave the default draws as they were.
"""

from __future__ import annotations

import argparse
import itertools

import pytest
import torch

from difftest.campaign.planning import CampaignConfig, Planner
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, LIMITS, SMALL_LIMITS, Limits, cases
from difftest.interfaces.commands._campaign_options import add_campaign_arguments, campaign_config
from difftest.model.case import Case
from difftest.model.errors import DifftestError


def _is_xqa_test_shape(c: Case) -> bool:
    a, b = c.attention, c.batch
    return (
        (a.num_qo_heads, a.num_kv_heads, a.head_dim, a.page_size) == (8, 4, 128, 64)
        and (a.q_dtype, a.kv_dtype, a.out_dtype) == ("bf16", "bf16", "bf16")
        and a.window_left in (-1, 127)
        and b.q_len == 4
        and len(b.prefix_lens) == 4
        and b.padding_requests == 0
        and b.padding_rows == 0
        and max(b.prefix_lens) <= 110
    )


def test_every_template_has_the_shape_and_both_windows_and_sinks_occur() -> None:
    drawn = sample_cases(cases(limits=SMALL_LIMITS), seed=5, count=80)
    bad = [c.digest() for c in drawn if not _is_xqa_test_shape(c)]
    assert not bad
    assert {c.attention.window_left for c in drawn} == {-1, 127}
    assert {c.attention.sinks for c in drawn} == {False, True}
    assert {c.batch.draft.kind for c in drawn} == {"causal", "tree"}


def test_a_campaign_with_the_small_limits_stays_in_the_shape() -> None:
    config = CampaignConfig(seed=3, limits=SMALL_LIMITS, cases_per_variant=4)
    planned = [c for _, c in itertools.islice(Planner(config, torch.device("cpu")), 40)]
    assert len(planned) == 40
    # Runtime variations draw their own window size; everything a kernel compiles for stays.
    fixed = [c for c in planned if c.attention.window_left < 0 or _is_xqa_test_shape(c)]
    assert all(
        (c.attention.num_qo_heads, c.attention.num_kv_heads, c.attention.page_size) == (8, 4, 64)
        and c.batch.q_len == 4
        and c.batch.padding_requests == 0
        for c in planned
    )
    assert fixed


def test_the_default_limits_keep_the_sizes_the_small_ones_exclude() -> None:
    # The new fields' defaults leave the default draws their range: one request, L = 2,
    # padding requests and rows all still occur.
    assert Limits(min_requests=1, min_q_len=2, padding=True, shape=None) == CPU_LIMITS
    drawn = sample_cases(cases(limits=CPU_LIMITS), seed=11, count=120)
    assert any(len(c.batch.prefix_lens) == 1 for c in drawn)
    assert any(c.batch.q_len == 2 for c in drawn)
    assert any(c.batch.padding_requests > 0 for c in drawn)
    assert any(c.batch.padding_rows > 0 for c in drawn)
    assert any(c.attention.head_dim != 128 for c in drawn)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_campaign_arguments(p)
    return p.parse_args(list(argv))


def test_the_option_selects_the_limits_and_refuses_a_preset_beside_small() -> None:
    cpu = torch.device("cpu")
    assert campaign_config(_args("--limits", "small"), cpu).limits is LIMITS["small"]
    assert campaign_config(_args(), cpu).limits is None
    with pytest.raises(DifftestError, match="takes no --preset"):
        campaign_config(_args("--limits", "small", "--preset", "llama-3.1-8b"), cpu)
