"""Each kernel-argument precondition refuses a bad launch with one clear line (CPU only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from difftest.generation.materialize import materialize
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec
from difftest.model.errors import DifftestError
from difftest.paths import kernel_args
from difftest.paths.contracts import (
    ContractViolation,
    check_context_args,
    check_decode_args,
    contracts_enabled,
)

L = 4


def _batch(storage: str = "hnd") -> Any:
    case = Case(
        attention=AttentionConfig(
            num_qo_heads=8, num_kv_heads=2, head_dim=32, page_size=16, sinks=True
        ),
        batch=BatchSpec(mode="draft_extend_v2", prefix_lens=(5, 40), q_len=L),
        pool=PoolSpec(kv_storage=storage, table_width="context", context_len=200),  # type: ignore[arg-type]
    )
    return materialize(case)


def decode_args(storage: str = "hnd") -> dict[str, Any]:
    """Valid ``check_decode_args`` keyword arguments built the way the XQA adapter builds them."""
    kw = kernel_args.decode_kwargs(_batch(storage), torch.zeros(64, dtype=torch.uint8), "xqa")
    keep = ("query", "kv_cache", "block_tables", "seq_lens", "q_len_per_req", "workspace_buffer")
    args = {k: kw[k] for k in keep}
    args.update(
        kv_layout=kw["kv_layout"],
        max_seq_len=kw["max_seq_len"],
        mask=kw["mask"],
        sinks=kw["sinks"],
        out=kw["out"],
        window_left=-1,
        min_workspace_bytes=0,
    )
    return args


def context_args() -> dict[str, Any]:
    kw = kernel_args.context_kwargs(_batch(), torch.zeros(64, dtype=torch.uint8))
    keep = (
        "query",
        "kv_cache",
        "block_tables",
        "seq_lens",
        "max_q_len",
        "max_kv_len",
        "batch_size",
        "cum_seq_lens_q",
        "cum_seq_lens_kv",
        "workspace_buffer",
        "kv_layout",
        "sinks",
        "out",
    )
    return {**{k: kw[k] for k in keep}, "min_workspace_bytes": 0}


def refused(check: Callable[..., None], args: dict[str, Any], argument: str) -> str:
    """Run ``check`` expecting a one-line violation that names ``argument``."""
    with pytest.raises(ContractViolation) as info:
        check(**args)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.argument == argument, message
    assert message.startswith(f"contract violation: {argument}="), message
    return message


def test_valid_arguments_pass_for_every_storage() -> None:
    for storage in ("hnd", "nhd", "kv_split_nhd"):
        check_decode_args(**decode_args(storage))
    check_context_args(**context_args())


def test_violation_is_a_difftest_error_and_contracts_can_be_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert issubclass(ContractViolation, DifftestError)
    assert contracts_enabled()
    monkeypatch.setenv("DIFFTEST_NO_CONTRACTS", "1")
    assert not contracts_enabled()


# -- decode: the production crash's shapes ----------------------------------------------------


def test_padded_query_rows_counted_as_requests() -> None:
    args = decode_args()
    q = args["query"]
    args["query"] = torch.cat([q, q[:L]])  # one CUDA-graph / DP padding request too many
    args["out"] = None
    message = refused(check_decode_args, args, "query.shape[0]")
    assert "2 requests x q_len_per_req 4 = 8 rows" in message
    assert "padded rows would be counted as requests" in message


def test_query_rows_not_a_multiple_of_q_len() -> None:
    args = decode_args()
    args["query"] = args["query"][:-1]
    args["out"] = None
    assert "a multiple of q_len_per_req=4" in refused(check_decode_args, args, "query.shape[0]")


def test_seq_lens_without_the_new_tokens() -> None:
    args = decode_args()
    args["seq_lens"] = torch.tensor([1, 40], dtype=torch.int32)  # prefixes, short first one
    message = refused(check_decode_args, args, "seq_lens[0]")
    assert "counting the new tokens" in message


def test_page_table_shaped_for_another_batch() -> None:
    args = decode_args()
    args["block_tables"] = torch.cat([args["block_tables"], args["block_tables"][:1]])
    message = refused(check_decode_args, args, "block_tables.shape[0]")
    assert "2 (one row per request)" in message


def test_page_table_too_narrow_for_a_sequence() -> None:
    args = decode_args()
    args["block_tables"] = args["block_tables"][:, :2].contiguous()  # 44 tokens need 3 pages
    message = refused(check_decode_args, args, "block_tables.shape[1]")
    assert ">= 3 columns" in message


def test_used_page_id_out_of_range() -> None:
    args = decode_args()
    args["block_tables"][1, 2] = 10_000
    message = refused(check_decode_args, args, "block_tables[1, 2]")
    assert "10000" in message and "[0, " in message and "(request 1 uses 3 pages)" in message


def test_the_first_bad_page_id_in_request_order_is_named() -> None:
    args = decode_args()
    args["block_tables"][1, 0] = -5
    args["block_tables"][0, 0] = -7
    message = refused(check_decode_args, args, "block_tables[0, 0]")
    assert "-7" in message


def test_negative_page_id() -> None:
    args = decode_args()
    args["block_tables"][0, 0] = -1
    refused(check_decode_args, args, "block_tables[0, 0]")


def test_columns_past_the_used_pages_may_hold_anything() -> None:
    args = decode_args()
    args["block_tables"][:, 5:] = 2**30  # SGLang leaves them uninitialised
    check_decode_args(**args)


def test_explicit_pool_size_bounds_page_ids() -> None:
    args = decode_args()
    refused(check_decode_args, {**args, "num_pages": 1}, "block_tables[1, 0]")


def test_seq_lens_for_another_batch() -> None:
    args = decode_args()
    args["seq_lens"] = args["seq_lens"][:1]
    refused(check_decode_args, args, "query.shape[0]")


def test_max_seq_len_below_a_sequence() -> None:
    args = decode_args()
    assert "max(seq_lens) = 44" in refused(
        check_decode_args, {**args, "max_seq_len": 40}, "max_seq_len"
    )


# -- decode: dtypes, devices, shapes, contiguity ----------------------------------------------


def test_seq_lens_dtype() -> None:
    args = decode_args()
    args["seq_lens"] = args["seq_lens"].long()
    assert "dtype in (int32)" in refused(check_decode_args, args, "seq_lens")


def test_block_tables_dtype() -> None:
    args = decode_args()
    args["block_tables"] = args["block_tables"].long()
    refused(check_decode_args, args, "block_tables")


def test_query_dtype_and_rank() -> None:
    args = decode_args()
    refused(check_decode_args, {**args, "query": args["query"].float()}, "query")
    refused(check_decode_args, {**args, "query": args["query"][0]}, "query")


def test_query_last_dim_must_be_contiguous() -> None:
    args = decode_args()
    q = args["query"]
    strided = torch.empty(*q.shape[:-1], 2 * q.shape[-1], dtype=q.dtype)[..., ::2]
    strided.copy_(q)
    refused(check_decode_args, {**args, "query": strided}, "query.stride(-1)")


def test_kv_last_dim_must_be_contiguous() -> None:
    args = decode_args()
    kv = args["kv_cache"]
    strided = torch.empty(*kv.shape[:-1], 2 * kv.shape[-1], dtype=kv.dtype)[..., ::2]
    refused(check_decode_args, {**args, "kv_cache": strided}, "kv_cache[0].stride(-1)")


def test_kv_head_dim_must_match_the_query() -> None:
    args = decode_args()
    refused(check_decode_args, {**args, "kv_cache": args["kv_cache"][..., :16]}, "query.shape[2]")


def test_query_heads_must_be_a_multiple_of_kv_heads() -> None:
    args = decode_args()
    args["query"] = args["query"][:, :7]
    args["out"] = None
    args["sinks"] = None
    assert "num_kv_heads 2" in refused(check_decode_args, args, "query.shape[1]")


def test_kv_tuple_halves_must_agree() -> None:
    args = decode_args("kv_split_nhd")
    k, v = args["kv_cache"]
    refused(check_decode_args, {**args, "kv_cache": (k, v[:-1])}, "kv_cache[1]")
    refused(check_decode_args, {**args, "kv_cache": (k,)}, "kv_cache")


def test_kv_layout_name() -> None:
    refused(check_decode_args, {**decode_args(), "kv_layout": "hnd"}, "kv_layout")


def test_tensors_must_share_the_query_device() -> None:
    args = decode_args()
    args["seq_lens"] = torch.empty(2, dtype=torch.int32, device="meta")
    assert "query's device cpu" in refused(check_decode_args, args, "seq_lens")


def test_mask_shape() -> None:
    args = decode_args()
    message = refused(check_decode_args, {**args, "mask": args["mask"][:, :, :1]}, "mask")
    assert "[2, 4, 2]" in message


def test_sinks_one_per_query_head() -> None:
    args = decode_args()
    refused(check_decode_args, {**args, "sinks": args["sinks"][:2]}, "sinks.shape[0]")
    refused(check_decode_args, {**args, "sinks": args["sinks"].double()}, "sinks")


def test_out_shape() -> None:
    args = decode_args()
    refused(check_decode_args, {**args, "out": args["out"][:-1]}, "out")


def test_q_len_per_req_at_least_one() -> None:
    refused(check_decode_args, {**decode_args(), "q_len_per_req": 0}, "q_len_per_req")


def test_window_left_range() -> None:
    refused(check_decode_args, {**decode_args(), "window_left": -2}, "window_left")


def test_workspace_zeroed_on_first_use() -> None:
    args = decode_args()
    args["workspace_buffer"] = torch.ones(64, dtype=torch.uint8)
    check_decode_args(**args)  # not its first use: stale semaphores are the kernel's own
    message = refused(check_decode_args, {**args, "workspace_first_use": True}, "workspace_buffer")
    assert "all zeros on first use" in message


def test_workspace_size() -> None:
    args = decode_args()
    message = refused(
        check_decode_args, {**args, "min_workspace_bytes": 1 << 20}, "workspace_buffer.nbytes"
    )
    assert ">= 1048576 bytes" in message


# -- context (prefill kernels) ----------------------------------------------------------------


def test_context_batch_size_must_match_seq_lens() -> None:
    refused(check_context_args, {**context_args(), "batch_size": 3}, "seq_lens.shape[0]")


def test_context_cum_seq_lens_length() -> None:
    args = context_args()
    args["cum_seq_lens_q"] = args["cum_seq_lens_q"][:-1]
    refused(check_context_args, args, "cum_seq_lens_q.shape[0]")


def test_context_cum_q_starts_at_zero() -> None:
    args = context_args()
    args["cum_seq_lens_q"] = args["cum_seq_lens_q"] + 1
    refused(check_context_args, args, "cum_seq_lens_q[0]")


def test_context_cum_q_non_decreasing() -> None:
    args = context_args()
    args["cum_seq_lens_q"] = torch.tensor([0, 6, 4], dtype=torch.int32)
    refused(check_context_args, args, "cum_seq_lens_q")


def test_context_cum_q_within_the_query_rows() -> None:
    args = context_args()
    args["cum_seq_lens_q"] = torch.tensor([0, 4, 12], dtype=torch.int32)
    args["max_q_len"] = 8
    assert "query.shape[0]=8" in refused(check_context_args, args, "cum_seq_lens_q[-1]")


def test_context_rows_past_the_batch_are_ignored_padding() -> None:
    args = context_args()
    args["query"] = torch.cat([args["query"], args["query"][:3]])
    args["out"] = None
    check_context_args(**args)


def test_context_max_q_len() -> None:
    refused(check_context_args, {**context_args(), "max_q_len": 3}, "max_q_len")


def test_context_cum_kv_must_be_prefix_sums_of_seq_lens() -> None:
    args = context_args()
    args["cum_seq_lens_kv"] = torch.tensor([0, 5, 45], dtype=torch.int32)  # without new tokens
    message = refused(check_context_args, args, "cum_seq_lens_kv[1]")
    assert "9 (prefix sum of seq_lens)" in message


def test_context_seq_lens_count_the_new_tokens() -> None:
    args = context_args()
    args["seq_lens"] = torch.tensor([2, 44], dtype=torch.int32)
    args["cum_seq_lens_kv"] = torch.tensor([0, 2, 46], dtype=torch.int32)
    message = refused(check_context_args, args, "seq_lens[0]")
    assert "its query length 4 (counting the new tokens)" in message


def test_context_max_kv_len() -> None:
    refused(check_context_args, {**context_args(), "max_kv_len": 43}, "max_kv_len")


def test_context_page_table_and_workspace_are_checked_too() -> None:
    args = context_args()
    refused(
        check_context_args,
        {**args, "block_tables": args["block_tables"][:, :1].contiguous()},
        "block_tables.shape[1]",
    )
    refused(
        check_context_args,
        {**args, "workspace_buffer": torch.ones(8), "workspace_first_use": True},
        "workspace_buffer",
    )
