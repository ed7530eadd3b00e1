"""The two CPU paths' building blocks read the page table as the case lays it out.

``torch-paged-online`` takes each tile's keys with :func:`tile_pages` (reordered and upcast in
one copy) and folds the query heads of a group into its rows; ``torch-sdpa`` gathers K and V
through one index (:func:`_slots`) and hands grouped heads to SDPA as they are. Both are held
to a token-by-token read of the pool here, in every storage layout and KV dtype.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.model.batch import Batch
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec
from difftest.paths import torch_sdpa
from difftest.paths.torch_online import stream, tile_pages, unpack


def _batch(kv_storage: str, kv_dtype: str) -> Batch:
    case = Case(
        attention=AttentionConfig(
            num_qo_heads=6, num_kv_heads=2, head_dim=16, page_size=4, kv_dtype=kv_dtype
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=(9, 0, 14), q_len=3),
        pool=PoolSpec(
            kv_storage=kv_storage, page_order="shuffled", spare_pages=2, table_fill="stale_pages"
        ),
        seed=11,
    )
    return materialize(case)


def _token(batch: Batch, pages: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """``[H_kv, D]``: token ``t`` of request ``b``, read through the table one token at a time."""
    ps = batch.case.attention.page_size
    return pages[int(batch.block_tables[b, t // ps]), :, t % ps].float()


LAYOUTS = [(s, d) for s in ("hnd", "nhd", "kv_split_nhd") for d in ("bf16", "fp8_e4m3")]


@pytest.mark.parametrize(("kv_storage", "kv_dtype"), LAYOUTS)
def test_a_tile_holds_its_pages_keys_in_order(kv_storage: str, kv_dtype: str) -> None:
    batch = _batch(kv_storage, kv_dtype)
    ps = batch.case.attention.page_size
    page = batch.block_tables[:, 1:3].long()  # two columns every request uses
    for pages in (batch.k_pages, batch.v_pages):
        tile = tile_pages(pages, page)
        assert tile.dtype == torch.float32 and tile.shape == (3, 2, 2 * ps, 16)
        for b in range(3):
            for n in range(2 * ps):
                assert torch.equal(tile[b, :, n], _token(batch, pages, b, ps + n))


@pytest.mark.parametrize(("kv_storage", "kv_dtype"), LAYOUTS)
def test_sdpa_gathers_every_live_token(kv_storage: str, kv_dtype: str) -> None:
    batch = _batch(kv_storage, kv_dtype)
    t_max = int(batch.seq_lens.max())
    where = torch_sdpa._slots(batch, t_max)
    for pages in (batch.k_pages, batch.v_pages):
        gathered = torch_sdpa._gather(pages, where)  # [bs, H_kv, Tmax, D]
        for b, n in enumerate(batch.seq_lens.tolist()):
            for t in range(n):
                assert torch.equal(gathered[b, :, t], _token(batch, pages, b, t))


@pytest.mark.parametrize(("kv_storage", "kv_dtype"), LAYOUTS)
def test_query_head_h_reads_kv_head_h_over_group(kv_storage: str, kv_dtype: str) -> None:
    """The streaming loop folds a KV head's query heads into its rows instead of repeating the
    head: what it computes is the loop over K/V repeated for every query head of the group
    (head ``h`` reads KV head ``h // group``), to float32 rounding; pairing head ``h`` with KV
    head ``h % H_kv`` instead would be far off."""
    batch = _batch(kv_storage, kv_dtype)
    x = unpack(batch)
    ps = batch.case.attention.page_size
    grouped = stream(x, ps)
    for index, name in ((torch.arange(6) // 3, "h // group"), (torch.arange(6) % 2, "h % H_kv")):
        repeated = dataclasses.replace(
            x,
            k_pages=x.k_pages.float()[:, index],
            v_pages=x.v_pages.float()[:, index],
            group_size=1,
        )
        close = torch.allclose(grouped, stream(repeated, ps), rtol=1e-5, atol=1e-6)
        assert close is (name == "h // group"), name


@pytest.mark.parametrize("sinks", [False, True])
def test_sdpa_reads_kv_head_h_over_group_for_query_head_h(sinks: bool) -> None:
    """``torch-sdpa`` hands grouped-query heads to SDPA as they are (``enable_gqa``): what it
    computes is SDPA over K/V repeated for every query head of their group."""
    case = Case(
        attention=AttentionConfig(
            num_qo_heads=8, num_kv_heads=2, head_dim=16, page_size=8, sinks=sinks
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=(40, 3), q_len=3),
        seed=4,
    )
    batch = materialize(case)
    a = case.attention
    bs, L, t_max = 2, 3, int(batch.seq_lens.max())
    where = torch_sdpa._slots(batch, t_max)
    k = torch_sdpa._gather(batch.k_pages, where).repeat_interleave(a.group_size, dim=1)
    v = torch_sdpa._gather(batch.v_pages, where).repeat_interleave(a.group_size, dim=1)
    bias = torch_sdpa._bias(batch, t_max).expand(bs, a.num_qo_heads, L, -1)
    if sinks:
        assert batch.sinks is not None
        zeros = torch.zeros(bs, a.num_qo_heads, 1, a.head_dim)
        k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
        sink = batch.sinks.view(1, -1, 1, 1).expand(bs, -1, L, 1)
        bias = torch.cat([bias, sink], dim=3)
    q = batch.q.float().view(bs, L, a.num_qo_heads, a.head_dim).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, scale=batch.bmm1_scale
    )
    expected = (out * batch.bmm2_scale).transpose(1, 2).reshape(bs * L, a.num_qo_heads, -1)
    got = torch_sdpa.run(batch).float()
    assert torch.allclose(got, expected.to(batch.out_dtype).float(), rtol=1e-2, atol=1e-3)
    assert not torch.allclose(got[:, 0], got[:, 2])  # heads of different groups differ
