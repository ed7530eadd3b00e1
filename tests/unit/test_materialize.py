"""Materialisation: bitwise reproducible, layout-independent, and faithful to the pool spec."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec, ValueSpec


def make(**pool: object) -> Case:
    return Case(
        attention=AttentionConfig(
            num_qo_heads=4, num_kv_heads=2, head_dim=8, page_size=4, sinks=True, k_scale=0.5
        ),
        batch=BatchSpec(mode="draft_extend_v2", prefix_lens=(9, 4, 13), q_len=3),
        pool=PoolSpec(**pool),  # type: ignore[arg-type]
        seed=11,
    )


def logical_kv(case: Case) -> list[torch.Tensor]:
    """Each request's K then V tokens, read through the page table, as raw bytes."""
    b = materialize(case)
    ps = case.attention.page_size
    out = []
    for r, t_len in enumerate(case.batch.seq_lens()):
        toks = torch.arange(t_len)
        pages = b.block_tables[r, toks // ps].long()
        for half in (b.k_pages, b.v_pages):
            out.append(half[pages, :, toks % ps].contiguous().view(torch.uint8))
    return out


def test_same_case_same_bits() -> None:
    case = make(page_order="shuffled", stale_fill="randn", spare_pages=2)
    a, b = materialize(case), materialize(case)
    assert torch.equal(a.kv_storage.view(torch.uint8), b.kv_storage.view(torch.uint8))
    assert torch.equal(a.q_padded.view(torch.uint8), b.q_padded.view(torch.uint8))
    assert torch.equal(a.block_tables, b.block_tables)


@pytest.mark.parametrize(
    "pool",
    [
        {"page_order": "reversed"},
        {"page_order": "shuffled", "spare_pages": 3},
        {"kv_storage": "nhd"},
        {"kv_storage": "kv_split_nhd", "stale_fill": "large"},
        {"table_width": "context", "context_len": 64, "table_fill": "out_of_range"},
    ],
)
def test_physical_layout_never_changes_what_a_token_holds(pool: dict[str, object]) -> None:
    base = logical_kv(make())
    other = logical_kv(make(**pool))
    assert all(torch.equal(x, y) for x, y in zip(base, other, strict=True))


def test_storage_layouts_are_views_of_one_pool() -> None:
    split = materialize(make(kv_storage="kv_split_nhd"))
    assert split.kv_storage.shape == (2, split.kv_cache.shape[0] * 4, 2, 8)
    assert split.kv_cache.data_ptr() == split.kv_storage.data_ptr()
    assert not split.kv_cache.is_contiguous() and split.kv_cache.stride(-1) == 1
    nhd = materialize(make(kv_storage="nhd"))
    assert nhd.kv_storage.shape[2:] == (4, 2, 8)


def test_shared_prefix_pages_are_the_same_physical_pages() -> None:
    case = make(shared_prefix_pages=1, page_order="shuffled")
    b = materialize(case)
    assert len(set(b.block_tables[:, 0].tolist())) == 1
    assert case.num_pages() == sum(case.pages_per_request()) - 2
    assert len(set(b.block_tables.flatten().tolist())) == case.num_pages()


def test_table_fill_past_used_columns() -> None:
    case = make(table_width="context", context_len=40, table_fill="out_of_range")
    b = materialize(case)
    used = case.pages_per_request()
    for r, n in enumerate(used):
        assert (b.block_tables[r, :n] < case.num_pages()).all()
        assert (b.block_tables[r, n:] >= case.num_pages()).all()
    stale = materialize(
        dataclasses.replace(case, pool=dataclasses.replace(case.pool, table_fill="stale_pages"))
    )
    assert (stale.block_tables < case.num_pages()).all()


def test_stale_fill_only_in_unused_slots() -> None:
    zeros = materialize(make(spare_pages=2))
    noisy = materialize(make(spare_pages=2, stale_fill="large"))
    differs = (zeros.kv_cache != noisy.kv_cache).any(dim=(1, 2, 4))  # [pages, slots]
    live = torch.zeros_like(differs)
    ps = 4
    for r, t_len in enumerate(make().batch.seq_lens()):
        for t in range(t_len):
            live[zeros.block_tables[r, t // ps], t % ps] = True
    assert not (differs & live).any()
    assert (differs | live).all()


def test_values_are_keyed_by_logical_coordinates() -> None:
    case = make()
    fewer = case.replace(batch=dataclasses.replace(case.batch, prefix_lens=(9, 4)))
    a, b = logical_kv(case), logical_kv(fewer)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b, strict=True))
    qa, qb = materialize(case).q, materialize(fewer).q
    assert torch.equal(qa[:6], qb)


def test_quantisation_divides_by_the_scale() -> None:
    case = make()
    unscaled = case.replace(attention=dataclasses.replace(case.attention, k_scale=1.0))
    ka, kb = materialize(case).k_pages.double(), materialize(unscaled).k_pages.double()
    assert torch.allclose(ka, kb * 2.0)  # k / 0.5, exact in bf16


def test_fp8_cache_is_clamped_not_nan() -> None:
    case = make().replace(values=ValueSpec(family="outlier_tokens", scale=4.0))
    fp8 = case.replace(
        attention=dataclasses.replace(case.attention, kv_dtype="fp8_e4m3", k_scale=1 / 64)
    )
    b = materialize(fp8)
    assert b.kv_cache.dtype == torch.float8_e4m3fn
    assert torch.isfinite(b.kv_cache.float()).all()


def test_padding_rows_and_requests() -> None:
    case = make().replace(
        batch=BatchSpec(
            mode="target_verify", prefix_lens=(3,), q_len=2, padding_requests=2, padding_rows=3
        )
    )
    b = materialize(case)
    assert b.q.shape == (6, 4, 8) and b.q_padded.shape == (9, 4, 8)
    assert b.seq_lens.tolist() == [5, 3, 3]
    assert b.cu_seqlens_q().tolist() == [0, 2, 4, 6]
    assert b.cu_seqlens_kv().tolist() == [0, 5, 8, 11]
    assert torch.isnan(b.new_output()).all()


def test_pool_values_saturate_instead_of_overflowing() -> None:
    # Large stale data divided by a tiny v_scale exceeds fp16: the pool must hold finite
    # values (an inf in a masked slot would make a correct kernel's 0 * v a NaN).
    case = make(stale_fill="large", spare_pages=1)
    tiny = case.replace(
        attention=dataclasses.replace(
            case.attention, q_dtype="fp16", kv_dtype="fp16", out_dtype="fp16", v_scale=2.0**-8
        )
    )
    b = materialize(tiny)
    assert torch.isfinite(b.kv_cache.float()).all()
    assert b.v_pages.float().abs().max() == torch.finfo(torch.float16).max
