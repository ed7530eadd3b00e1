"""The kernel-argument builders against ``docs/semantics.md`` §3, on a CPU (no flashinfer)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
)
from difftest.paths import kernel_args

WS = torch.zeros(64, dtype=torch.uint8)


def make(
    *,
    storage: str = "kv_split_nhd",
    convention: str = "sglang",
    hkv: int = 2,
    L: int = 4,
    prefixes: tuple[int, ...] = (5, 40),
    padding_requests: int = 0,
    padding_rows: int = 0,
    kv: str = "bf16",
    tree: bool = False,
    window: int = -1,
) -> Case:
    return Case(
        attention=AttentionConfig(
            num_qo_heads=8,
            num_kv_heads=hkv,
            head_dim=32,
            page_size=16,
            kv_dtype=kv,  # type: ignore[arg-type]
            window_left=window,
            sinks=True,
            sm_scale=0.3,
            q_scale=2.0,
            k_scale=0.5,
            v_scale=4.0,
            o_scale=2.0,
        ),
        batch=BatchSpec(
            mode="draft_extend_v2",
            prefix_lens=prefixes,
            q_len=L,
            draft=TreeDraft(parents=(-1, 0, 0, 1)) if tree else CausalDraft(),
            padding_requests=padding_requests,
            padding_rows=padding_rows,
        ),
        pool=PoolSpec(
            kv_storage=storage,  # type: ignore[arg-type]
            page_order="shuffled",
            table_width="context",
            table_fill="stale_pages",
            spare_pages=2,
            context_len=1000,
        ),
        convention=convention,  # type: ignore[arg-type]
        seed=3,
    )


def test_sglang_decode_arguments_follow_the_convention() -> None:
    case = make()
    batch = materialize(case)
    kw = kernel_args.decode_kwargs(batch, WS, "xqa")
    assert kw["seq_lens"].dtype == torch.int32
    assert kw["seq_lens"].tolist() == [5 + 4, 40 + 4]  # P_b + L
    assert kw["max_seq_len"] == 1000  # context_len
    assert kw["block_tables"].dtype == torch.int32
    assert kw["block_tables"].shape == (2, -(-1000 // 16))  # ceil(context_len / page_size)
    assert kw["q_len_per_req"] == 4
    assert kw["query"].shape[0] == 2 * 4
    assert kw["bmm1_scale"] == pytest.approx(0.3 * 2.0 * 0.5)
    assert kw["bmm2_scale"] == pytest.approx(4.0 / 2.0)
    assert kw["out_dtype"] == torch.bfloat16
    assert kw["workspace_buffer"] is WS
    assert kw["sinks"] is batch.sinks and kw["sinks"].dtype == torch.float32
    assert kw["kv_layout"] == "HND" and kw["backend"] == "xqa"
    assert torch.isnan(kw["out"]).all() and kw["out"].shape == kw["query"].shape


def test_sglang_split_buffers_are_strided_hnd_views_of_the_per_token_pool() -> None:
    batch = materialize(make())
    (k, v), layout = kernel_args.trtllm_kv(batch)
    assert layout == "HND"
    assert k.data_ptr() == batch.kv_storage[0].data_ptr()  # a view, no copy
    assert v.data_ptr() == batch.kv_storage[1].data_ptr()
    assert k.shape == (batch.case.num_pages(), 2, 16, 32)
    assert k.stride() == (16 * 2 * 32, 32, 2 * 32, 1)  # permuted NHD: not contiguous
    assert torch.equal(k, batch.k_pages) and torch.equal(v, batch.v_pages)


def test_one_kv_head_gets_a_canonical_stride() -> None:
    batch = materialize(make(hkv=1))
    (k, _), _ = kernel_args.trtllm_kv(batch)
    assert k.shape[1] == 1
    assert k.stride() == (16 * 32, 16 * 32, 32, 1)  # not (.., 32, 32, 1): TMA rejects that
    assert torch.equal(k, batch.k_pages)


@pytest.mark.parametrize(("storage", "layout"), [("hnd", "HND"), ("nhd", "NHD")])
def test_sglang_single_tensor_storage_is_passed_with_its_layout(storage: str, layout: str) -> None:
    batch = materialize(make(storage=storage))
    kv, got = kernel_args.trtllm_kv(batch)
    assert got == layout and kv is batch.kv_storage


def test_wrappers_get_nhd_pages_of_the_split_buffers() -> None:
    batch = materialize(make())
    (k, _v), layout = kernel_args.wrapper_kv(batch)
    assert layout == "NHD" and k.is_contiguous()
    assert torch.equal(k.transpose(1, 2), batch.k_pages)


def test_plain_convention_is_exact_and_contiguous() -> None:
    batch = materialize(make(convention="plain"))
    kw = kernel_args.decode_kwargs(batch, WS, "xqa")
    assert kw["max_seq_len"] == 44  # the longest T_b
    assert kw["block_tables"].shape == (2, 3)  # ceil(44 / 16)
    assert kw["block_tables"].is_contiguous()
    assert torch.equal(kw["block_tables"], batch.block_tables[:, :3])
    assert kw["kv_layout"] == "HND" and kw["kv_cache"].is_contiguous()
    assert torch.equal(kw["kv_cache"], batch.kv_cache)


def test_packed_mask_bits_for_a_chain_are_lower_triangular() -> None:
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    packed = kernel_args.pack_draft_mask(mask, batch_size=3)
    assert packed.dtype == torch.uint16 and packed.shape == (3, 4, 2)
    assert packed[0, :, 0].tolist() == [0b1, 0b11, 0b111, 0b1111]
    assert packed[:, :, 1].eq(0).all() and torch.equal(packed[0], packed[2])


def test_packed_mask_spans_words_and_halves_little_endian() -> None:
    L = 40
    mask = torch.zeros(L, L, dtype=torch.bool)
    mask[3, 0] = mask[3, 17] = mask[3, 31] = mask[3, 32] = mask[3, 39] = True
    packed = kernel_args.pack_draft_mask(mask, batch_size=1)
    assert packed.shape == (1, L, 4)  # 2 * ceil(40 / 32) uint16 per row
    lo, hi, lo2, hi2 = (int(x) for x in packed[0, 3])
    word0 = lo | hi << 16
    word1 = lo2 | hi2 << 16
    assert word0 == (1 << 0) | (1 << 17) | (1 << 31)
    assert word1 == (1 << 0) | (1 << 7)
    assert packed[0, 0].eq(0).all()


def test_tree_draft_mask_is_packed_from_the_case() -> None:
    batch = materialize(make(tree=True))
    kw = kernel_args.decode_kwargs(batch, WS, "xqa")
    # parents (-1, 0, 0, 1): row 2 sees {0, 2}, row 3 sees {0, 1, 3}
    assert kw["mask"][1, :, 0].tolist() == [0b1, 0b11, 0b101, 0b1011]


def test_trtllm_gen_gets_no_mask_and_an_fp8_query_for_an_fp8_cache() -> None:
    batch = materialize(make(kv="fp8_e4m3"))
    kw = kernel_args.decode_kwargs(batch, WS, "trtllm-gen")
    assert "mask" not in kw
    assert kw["query"].dtype == torch.float8_e4m3fn
    assert kernel_args.decode_kwargs(batch, WS, "xqa")["query"].dtype == torch.bfloat16


def test_context_arguments_keep_padding_rows_and_give_ragged_metadata() -> None:
    batch = materialize(make(padding_requests=1, padding_rows=3))
    kw = kernel_args.context_kwargs(batch, WS)
    assert kw["query"].shape[0] == 3 * 4 + 3  # DP padding rows ride along under sglang
    assert kw["batch_size"] == 3 and kw["max_q_len"] == 4 and kw["max_kv_len"] == 1000
    assert kw["cum_seq_lens_q"].tolist() == [0, 4, 8, 12]
    assert kw["seq_lens"].tolist() == [9, 44, 5]  # the CUDA-graph dummy has T = 1 + L
    assert kw["cum_seq_lens_kv"].tolist() == [0, 9, 53, 58]
    assert kw["causal"] is True and kw["out"].shape == kw["query"].shape
    plain = kernel_args.context_kwargs(materialize(make(convention="plain", padding_rows=3)), WS)
    assert plain["query"].shape[0] == 2 * 4 and plain["max_kv_len"] == 44


def test_fmha_v2_arguments() -> None:
    batch = materialize(make(storage="nhd", window=0))
    kw = kernel_args.fmha_v2_kwargs(batch, WS)
    _query, paged = kw["qkv"]
    assert kw["input_layout"] == "Q_PAGED_KV_NHD" and paged is batch.kv_storage
    assert kw["mask_mode"] == "sliding_window" and kw["window_left"] == 0
    assert kw["cum_seq_lens_kv"].tolist() == [0, 9, 53]
    hnd = kernel_args.fmha_v2_kwargs(materialize(make(convention="plain")), WS)
    assert hnd["input_layout"] == "Q_PAGED_KV_HND" and hnd["mask_mode"] == "causal"
    with pytest.raises(ValueError, match="split K/V"):
        kernel_args.fmha_v2_kwargs(materialize(make()), WS)


def test_fmha_v2_gets_sglangs_split_buffers_as_k_v_with_block_offsets() -> None:
    """The (k, v) form: contiguous NHD page views of one allocation, and [bs, 2, W] offsets
    counted from K's start, so that the kernel's flat addressing of block ``offset`` finds
    each request's K page and its V page."""
    batch = materialize(make())
    kw = kernel_args.fmha_v2_kwargs(batch, WS, split_kv=True)
    _query, (k, v) = kw["qkv"]
    assert kw["input_layout"] == "Q_PAGED_KV_NHD"
    assert k.is_contiguous() and v.is_contiguous() and k.shape == v.shape
    assert k.shape[1:] == (16, 2, 32)  # [pages, page_size, H_kv, D]
    offsets = kw["block_tables"]
    table = batch.block_tables
    assert offsets.dtype == torch.int32 and offsets.shape == (table.shape[0], 2, table.shape[1])
    assert torch.equal(offsets[:, 0], table)
    pages = k.shape[0]
    assert torch.equal(offsets[:, 1], table + pages)  # V lies one pool of pages after K
    flat = batch.kv_storage.view(-1, *k.shape[1:])  # what the kernel addresses from k's pointer
    for b, t in enumerate(batch.seq_lens.tolist()):
        for col in range(-(-t // 16)):
            page = int(table[b, col])
            assert torch.equal(flat[int(offsets[b, 0, col])], k[page])
            assert torch.equal(flat[int(offsets[b, 1, col])], v[page])


def test_page_indices_list_each_requests_used_pages_in_order() -> None:
    batch = materialize(make())
    indptr, indices, last = kernel_args.page_indices(batch)
    assert indptr.tolist() == [0, 1, 4]  # ceil(9/16)=1, ceil(44/16)=3
    assert last.tolist() == [9, 44 - 32]
    table = batch.block_tables
    assert indices.tolist() == [int(table[0, 0]), *table[1, :3].tolist()]
    assert indices.dtype == indptr.dtype == last.dtype == torch.int32


def test_prefill_plan_kwargs_with_a_tree_mask() -> None:
    batch = materialize(make(tree=True, window=7))
    kw = kernel_args.prefill_plan_kwargs(batch)
    assert kw["causal"] is True and kw["window_left"] == 7
    assert kw["sm_scale"] == pytest.approx(batch.bmm1_scale)
    assert kw["qo_indptr"].tolist() == [0, 4, 8]
    mask = kw["custom_mask"]
    assert mask.numel() == 4 * 9 + 4 * 44
    first = mask[: 4 * 9].view(4, 9)
    assert first[:, :5].all()  # the prefix is always visible
    assert torch.equal(first[:, 5:], batch.draft_mask)
    chain = kernel_args.prefill_plan_kwargs(materialize(make()))
    assert "custom_mask" not in chain


def test_decode_plan_kwargs() -> None:
    batch = materialize(make(window=3))
    kw = kernel_args.decode_plan_kwargs(batch)
    assert kw["indptr"].tolist() == [0, 1, 4] and kw["window_left"] == 3
    assert kw["head_dim"] == 32 and kw["page_size"] == 16
    assert kw["q_data_type"] == torch.bfloat16 and kw["o_data_type"] == torch.bfloat16


def test_builders_do_not_touch_the_batch() -> None:
    batch = materialize(make())
    before = [t.clone() for t in (batch.q_padded, batch.kv_storage, batch.block_tables)]
    kernel_args.decode_kwargs(batch, WS, "xqa")
    kernel_args.context_kwargs(batch, WS)
    kernel_args.prefill_plan_kwargs(batch)
    after = (batch.q_padded, batch.kv_storage, batch.block_tables)
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    assert dataclasses.is_dataclass(kernel_args.paging(batch))
