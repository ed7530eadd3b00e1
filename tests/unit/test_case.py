"""The case model: validation names the field, JSON round-trips, digests identify."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from difftest import __all__ as public_names
from difftest.generation.modes import Modes
from difftest.generation.strategies import cases
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    PoolSpec,
    TreeDraft,
    draft_mask_rows,
)
from difftest.model.errors import FormatError, InvalidCase


def make(**batch: object) -> Case:
    spec = {"mode": "target_verify", "prefix_lens": (5, 9), "q_len": 3, **batch}
    return Case(
        attention=AttentionConfig(num_qo_heads=4, num_kv_heads=2, head_dim=16, page_size=4),
        batch=BatchSpec(**spec),  # type: ignore[arg-type]
    )


def test_public_api_is_exactly_what_is_exported() -> None:
    import difftest

    assert sorted(public_names) == sorted(set(public_names))
    assert sorted(public_names) == sorted(difftest._SOURCES)
    for name in public_names:
        assert hasattr(difftest, name), name


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_qo_heads": 3, "num_kv_heads": 2}, "num_qo_heads"),
        ({"window_left": -2}, "window_left"),
        ({"kv_dtype": "fp4"}, "kv_dtype"),
        ({"k_scale": 0.0}, "k_scale"),
        ({"sm_scale": float("nan")}, "sm_scale"),
        ({"page_size": 0}, "page_size"),
    ],
)
def test_invalid_attention_config_names_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 4}
    with pytest.raises(InvalidCase) as err:
        AttentionConfig(**{**base, **kwargs})  # type: ignore[arg-type]
    assert err.value.field == field
    assert field in str(err.value)


def test_tree_parents_must_point_backwards() -> None:
    with pytest.raises(InvalidCase, match="parent of token 2"):
        TreeDraft(parents=(-1, 0, 2))
    with pytest.raises(InvalidCase, match="one parent per draft token"):
        make(draft=TreeDraft(parents=(-1, 0)))


def test_shared_pages_must_fit_inside_every_prefix() -> None:
    case = make()
    with pytest.raises(InvalidCase, match="shared pages"):
        case.replace(pool=PoolSpec(shared_prefix_pages=2))  # 8 tokens > prefix 5
    assert case.replace(pool=PoolSpec(shared_prefix_pages=1)).used_pages() == 2 + 3 - 1


def test_context_len_must_cover_the_longest_sequence() -> None:
    with pytest.raises(InvalidCase, match="context_len"):
        make().replace(pool=PoolSpec(context_len=11, table_width="context"))


def test_derived_quantities() -> None:
    case = make(padding_requests=1, padding_rows=2)
    assert case.batch.seq_lens() == (8, 12, 4)  # padding request: prefix 1 + L
    assert case.batch.num_query_rows == 9
    assert case.pages_per_request() == (2, 3, 1)
    assert case.table_width() == 3
    wide = case.replace(pool=PoolSpec(table_width="context", context_len=30))
    assert wide.table_width() == 8
    a = case.attention
    assert a.bmm1_scale == pytest.approx(16**-0.5)
    scaled = AttentionConfig(
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=16,
        page_size=4,
        q_scale=2.0,
        k_scale=0.5,
        v_scale=3.0,
        o_scale=4.0,
        sm_scale=0.1,
    )
    assert scaled.bmm1_scale == pytest.approx(0.1 * 2.0 * 0.5)
    assert scaled.bmm2_scale == pytest.approx(3.0 / 4.0)


def test_draft_mask_rows_follow_ancestors() -> None:
    rows = draft_mask_rows(TreeDraft(parents=(-1, 0, 0, 2)), 4)
    assert rows == [
        [True, False, False, False],
        [True, True, False, False],
        [True, False, True, False],
        [True, False, True, True],
    ]
    chain = draft_mask_rows(make().batch.draft, 3)
    assert chain == [[True, False, False], [True, True, False], [True, True, True]]


@given(cases())
def test_generated_cases_round_trip_through_json(case: Case) -> None:
    text = json.dumps(case.to_json())
    back = Case.from_json(json.loads(text))
    assert back == case
    assert back.digest() == case.digest()


def _plain(obj: object) -> object:
    """The JSON form spelled out: every dataclass a dict of its constructor's fields (the
    late ones left out when unset; a memo is no field of the case), every tuple a list."""
    import dataclasses

    from difftest.model.case import OMITTED_WHEN_NONE

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: _plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.init and (getattr(obj, f.name) is not None or f.name not in OMITTED_WHEN_NONE)
        }
    if isinstance(obj, tuple):
        return [_plain(x) for x in obj]
    return obj


@given(
    cases(modes=Modes(ragged=True, skip_softmax=True)) | cases(modes=Modes(graph=True)) | cases()
)
def test_the_json_form_is_every_field_spelled_out(case: Case) -> None:
    """``to_json`` (and so the digest) takes shortcuts for speed; its data is the plain
    recursive form of the case, so no digest changed."""
    data = case.to_json()
    assert data.pop("format") == "difftest-case/1"
    assert data == _plain(case)


def test_from_json_rejects_bad_input_with_one_line() -> None:
    good = make().to_json()
    with pytest.raises(FormatError, match="unknown case format"):
        Case.from_json({**good, "format": "difftest-case/99"})
    with pytest.raises(FormatError, match="unknown key"):
        Case.from_json({**good, "colour": "red"})
    broken = json.loads(json.dumps(good))
    del broken["batch"]["q_len"]
    with pytest.raises(FormatError, match="missing required"):
        Case.from_json(broken)
    broken = json.loads(json.dumps(good))
    broken["attention"]["num_kv_heads"] = 3
    with pytest.raises(FormatError, match="num_qo_heads"):
        Case.from_json(broken)
    with pytest.raises(FormatError, match="JSON object"):
        Case.from_json([1, 2])
    for err_text in (str(e) for e in [FormatError("x", "y")]):
        assert "\n" not in err_text


def test_the_digest_is_computed_once_and_is_no_part_of_the_case() -> None:
    case = make()
    first = case.digest()
    text = case.canonical_json()
    assert case._memo == [text, first] and case.digest() is first
    assert case.canonical_json() is text and json.loads(text) == case.to_json()
    assert case == make() and hash(case) == hash(make()) and repr(case) == repr(make())
    assert case.replace(seed=1).digest() != first  # a new case, a new memo
    assert Case.from_json(case.to_json()).digest() == first


def test_digest_changes_with_any_field() -> None:
    case = make()
    assert case.digest() != case.replace(seed=1).digest()
    assert case.digest() == make().digest()
