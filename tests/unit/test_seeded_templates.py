"""Seeded templates (:attr:`CampaignConfig.hypothesis_every`): a CPU campaign draws one
template in :data:`CPU_HYPOTHESIS_EVERY` with Hypothesis and builds the others with
:func:`template_case` from seeded choices. Checked here: which template comes from where, that
the seeded ones are fresh configurations (not variations of one), valid and as varied as the
strategy's, that ``hypothesis_every=1`` plans what the planner always planned, and the device
defaults."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import torch

from difftest.campaign.planning import (
    CHUNK,
    CPU_HYPOTHESIS_EVERY,
    CampaignConfig,
    Planner,
    case_seed,
    hold,
    swarm_mask,
)
from difftest.generation.choices import SeededChoices
from difftest.generation.presets import PRESETS
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import (
    CPU_LIMITS,
    GENERIC_HEAD_DIMS,
    PAGE_SIZES,
    cases,
    template_case,
)
from difftest.model.case import Case

CPU = torch.device("cpu")


def _templates(config: CampaignConfig, count: int) -> list[tuple[int, Case]]:
    return list(itertools.islice(Planner(config, CPU).templates(), count))


def test_one_template_in_n_is_hypothesis_s_and_the_rest_are_seeded(tmp_path: Path) -> None:
    every, seed = 4, 5
    config = CampaignConfig(seed=seed, out_dir=tmp_path, hypothesis_every=every)
    planned = _templates(config, 3 * every)
    assert [n for n, _ in planned] == list(range(3 * every))  # nothing unsupported: no paths
    drawn = sample_cases(cases(limits=CPU_LIMITS), seed=case_seed(seed, 0), count=CHUNK)
    build = functools.partial(template_case, limits=CPU_LIMITS)
    for place in range(3):
        choices = SeededChoices(case_seed(seed ^ 0x7E3F, place))
        expected = [drawn[place], *(build(choices) for _ in range(every - 1))]
        for k, template in enumerate(expected):
            number = place * every + k
            assert planned[number][1] == hold(template, swarm_mask(seed, number))
    # the same seed plans the same templates; another seed others
    assert _templates(config, 3 * every) == planned
    other = _templates(CampaignConfig(seed=seed + 1, out_dir=tmp_path, hypothesis_every=every), 8)
    seeded = {c.digest() for n, c in planned if n % every}  # (Hypothesis's first: its simplest)
    assert seeded.isdisjoint({c.digest() for n, c in other if n % every})


def test_every_template_from_hypothesis_is_what_the_planner_planned_before(
    tmp_path: Path,
) -> None:
    config = CampaignConfig(seed=2, out_dir=tmp_path, hypothesis_every=1)
    planned = _templates(config, 2 * CHUNK)
    for chunk in range(2):
        drawn = sample_cases(cases(limits=CPU_LIMITS), seed=case_seed(2, chunk), count=CHUNK)
        for n, template in enumerate(drawn):
            number = chunk * CHUNK + n
            assert planned[number] == (number, hold(template, swarm_mask(2, number)))


def test_seeded_templates_are_fresh_valid_configurations() -> None:
    """Every choice is made afresh, the compile variant's too: heads, head dims, page sizes,
    dtypes, presets, shapes (long and wide) all vary, and every case is valid."""
    choices = SeededChoices(3)
    made = [template_case(choices, limits=CPU_LIMITS) for _ in range(400)]
    assert len({c.compile_variant() for c in made}) > 100
    assert {c.attention.head_dim for c in made} >= set(GENERIC_HEAD_DIMS)
    assert {c.attention.page_size for c in made} == set(PAGE_SIZES)
    assert {c.attention.kv_dtype for c in made} == {"bf16", "fp16", "fp8_e4m3"}
    assert {c.batch.draft.kind for c in made} == {"causal", "tree"}
    assert any(c.attention.window_left >= 0 for c in made)
    assert any(c.attention.sinks for c in made)
    heads = {(c.attention.num_qo_heads, c.attention.num_kv_heads) for c in made}
    assert any(h in heads for p in PRESETS.values() for h in p.heads if h not in [(1, 1)])
    assert any(max(c.batch.prefix_lens) >= 8192 and c.batch.num_requests == 1 for c in made)
    assert any(c.batch.num_requests >= 64 for c in made)
    for case in made:
        assert Case.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_a_planned_template_is_held_once_and_holding_it_again_changes_nothing(
    tmp_path: Path,
) -> None:
    """The planner holds a template's swarm features when it draws it and not again when it
    shapes the template's cases: holding is idempotent on what it plans."""
    config = CampaignConfig(seed=7, out_dir=tmp_path, hypothesis_every=8)
    for number, template in _templates(config, 160):
        mask = swarm_mask(7, number)
        assert hold(template, mask) == template


def test_the_device_chooses_the_default(tmp_path: Path) -> None:
    config = CampaignConfig(out_dir=tmp_path)
    assert Planner(config, CPU).hypothesis_every == CPU_HYPOTHESIS_EVERY > 1
    assert Planner(config, torch.device("cuda")).hypothesis_every == 1
    chosen = CampaignConfig(out_dir=tmp_path, hypothesis_every=3)
    assert Planner(chosen, torch.device("cuda")).hypothesis_every == 3
