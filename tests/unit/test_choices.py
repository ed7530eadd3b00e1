"""The seeded choices campaigns draw runtime variations and launch partners from
(:mod:`difftest.generation.choices`): deterministic, valid, the variant and launch they must
keep, and the whole range of each runtime choice, as the Hypothesis strategies of the same
builders give."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest.execution import packing
from difftest.generation.choices import DrawnChoices, SeededChoices, sample_distinct
from difftest.generation.modes import Modes
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import (
    CPU_LIMITS,
    FAMILIES,
    GPU_LIMITS,
    PAGE_ORDERS,
    STALE_FILLS,
    TABLE_FILLS,
    cases,
    partner_case,
    runtime_variations,
    variation_case,
)
from difftest.model.case import Case

TEMPLATES = sample_cases(cases(limits=CPU_LIMITS), seed=11, count=24)


def _kernel_shape(case: Case) -> tuple[object, ...]:
    """The compile variant without the KV layout (which variations draw)."""
    return tuple(v for i, v in enumerate(case.compile_variant()) if i != 11)


def _variations(template: Case, seed: int, count: int, **kw: object) -> list[Case]:
    build = functools.partial(variation_case, template=template, limits=CPU_LIMITS, **kw)
    return sample_distinct(build, Case.digest, seed=seed, count=count)


def test_seeded_choices_are_deterministic_and_within_their_ranges() -> None:
    a, b = SeededChoices(5), SeededChoices(5)
    draws = [(a.integer(0, 9), a.pick("xyz"), a.flag(), a.real(0.5, 2.0)) for _ in range(200)]
    assert draws == [
        (b.integer(0, 9), b.pick("xyz"), b.flag(), b.real(0.5, 2.0)) for _ in range(200)
    ]
    assert {d[0] for d in draws} == set(range(10)) and {d[1] for d in draws} == set("xyz")
    assert {d[2] for d in draws} == {True, False}
    assert all(0.5 <= d[3] <= 2.0 for d in draws)
    assert draws != [(c.integer(0, 9), c.pick("xyz"), c.flag(), c.real(0.5, 2.0))
                     for c in [SeededChoices(6)] for _ in range(200)]  # fmt: skip
    with pytest.raises(ValueError):
        a.integer(3, 2)
    with pytest.raises(ValueError):
        a.pick([])


def test_the_same_seed_gives_the_same_cases_and_another_seed_others() -> None:
    template = TEMPLATES[0]
    first = _variations(template, 3, 16)
    again = _variations(template, 3, 16)
    assert [c.to_json() for c in first] == [c.to_json() for c in again]
    assert {c.digest() for c in first}.isdisjoint(
        {c.digest() for c in _variations(template, 4, 16)}
    )
    assert len({c.digest() for c in first}) == len(first) == 16  # distinct


@pytest.mark.parametrize("limits", [CPU_LIMITS, GPU_LIMITS], ids=["cpu", "gpu"])
def test_variations_keep_the_compile_variant_and_the_limits(limits: object) -> None:
    """Everything of the variant but the KV layout, a runtime choice of the strategy too."""
    for template in TEMPLATES:
        build = functools.partial(variation_case, template=template, limits=limits)
        for case in sample_distinct(build, Case.digest, seed=7, count=12):
            assert _kernel_shape(case) == _kernel_shape(template)
            assert case.batch.num_requests <= limits.max_requests  # type: ignore[attr-defined]
            assert Case.from_json(json.loads(json.dumps(case.to_json()))) == case  # valid


def test_partners_can_share_the_templates_launch() -> None:
    for template in TEMPLATES:
        build = functools.partial(partner_case, template=template, limits=CPU_LIMITS)
        partners = sample_distinct(build, Case.digest, seed=9, count=3)
        assert partners
        for partner in partners:
            assert packing.pack_key(partner) == packing.pack_key(template)
            assert partner.batch.padding_rows == 0
        assert packing.packable([*partners, template]) is None


def test_partners_of_a_ragged_template_are_ragged_and_share_its_launch() -> None:
    """A ragged verify launch stays ragged when packed: each partner of two or more requests
    has its own new-token counts (one of them ``L``), and the launch is still one launch."""
    ragged = [
        t.replace(
            batch=dataclasses.replace(
                t.batch,
                q_lens=(t.batch.q_len - 1,) + (t.batch.q_len,) * (len(t.batch.prefix_lens) - 1),
            )
        )
        for t in TEMPLATES
        if t.batch.q_len >= 2 and len(t.batch.prefix_lens) >= 2
    ]
    assert len(ragged) >= 4
    counted = 0
    for template in ragged:
        build = functools.partial(partner_case, template=template, limits=CPU_LIMITS)
        partners = sample_distinct(build, Case.digest, seed=9, count=6)
        assert partners
        for partner in partners:
            b = partner.batch
            assert packing.pack_key(partner) == packing.pack_key(template)
            assert Case.from_json(json.loads(json.dumps(partner.to_json()))) == partner  # valid
            if len(b.prefix_lens) >= 2:
                assert b.q_lens is not None and max(b.q_lens) == b.q_len > min(b.q_lens) >= 1
                counted += 1
            else:
                assert b.q_lens is None
        assert packing.packable([*partners, template]) is None
    assert counted >= len(ragged)
    # a uniform template keeps uniform partners: plain campaigns draw what they drew before
    for template in TEMPLATES[:8]:
        build = functools.partial(partner_case, template=template, limits=CPU_LIMITS)
        assert all(
            p.batch.q_lens is None for p in sample_distinct(build, Case.digest, seed=9, count=3)
        )


def test_seeded_variations_reach_every_runtime_choice() -> None:
    """Over the templates' variations, every pool layout, fill, value family, scale setting,
    mode and convention occurs: the seeded sampler covers what the strategy can draw."""
    seen = [c for t in TEMPLATES for c in _variations(t, 1, 24)]
    assert {c.pool.page_order for c in seen} == set(PAGE_ORDERS)
    assert {c.pool.table_fill for c in seen} == set(TABLE_FILLS)
    assert {c.pool.stale_fill for c in seen} == set(STALE_FILLS)
    assert {c.pool.kv_storage for c in seen} == {"hnd", "nhd", "kv_split_nhd"}
    assert {c.pool.table_width for c in seen} == {"exact", "context"}
    assert {c.values.family for c in seen} == set(FAMILIES)
    assert {c.batch.mode for c in seen} == {"target_verify", "draft_extend_v2"}
    assert {c.convention for c in seen} == {"plain", "sglang"}
    assert any(c.attention.sm_scale is not None for c in seen)
    assert any(c.attention.sm_scale is None for c in seen)
    assert any(c.attention.v_scale != 1.0 for c in seen)
    assert any(c.batch.padding_requests > 0 for c in seen)
    assert any(c.pool.shared_prefix_pages > 0 for c in seen)
    assert max(c.batch.num_requests for c in seen) > 4


@pytest.mark.parametrize(
    "modes",
    [Modes(ragged=True), Modes(skip_softmax=True), Modes(graph=True)],
    ids=["ragged", "skip", "graph"],
)
def test_seeded_variations_carry_the_modes(modes: Modes) -> None:
    seen = [c for t in TEMPLATES for c in _variations(t, 2, 8, modes=modes)]
    if modes.ragged:
        assert any(c.batch.is_ragged for c in seen)
    if modes.skip_softmax:
        assert all(c.attention.skip_softmax_threshold_scale_factor is not None for c in seen)
    if modes.graph:
        assert all(c.graph is not None and c.convention == "sglang" for c in seen)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_hypothesis_strategy_runs_the_same_builder(data: st.DataObject) -> None:
    """Under Hypothesis the same builder draws each choice: its cases keep the template's
    kernel shape, through the strategy and through a DrawnChoices made by hand."""
    template = data.draw(st.sampled_from(TEMPLATES))
    case = data.draw(runtime_variations(template, CPU_LIMITS))
    assert _kernel_shape(case) == _kernel_shape(template)
    by_hand = data.draw(
        st.composite(lambda draw: variation_case(DrawnChoices(draw), template, CPU_LIMITS))()
    )
    assert _kernel_shape(by_hand) == _kernel_shape(template)


def test_sample_distinct_stops_when_few_distinct_results_exist() -> None:
    calls = itertools.count()

    def build(ch: SeededChoices) -> int:
        next(calls)
        return ch.integer(0, 2)

    out = sample_distinct(build, str, seed=0, count=10)
    assert sorted(out) == [0, 1, 2]
    assert next(calls) == 40  # 4 * count tries, then it stops
