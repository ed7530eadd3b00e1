"""The reduction passes, one module per family of case fields, and the order the driver runs
them in: cheap passes first (the runtime shape: requests, lengths, pool, values), then the
expensive ones (each candidate is a new compile variant on a GPU: ``L``, masks, dtypes, heads,
head_dim)."""

from __future__ import annotations

from difftest.model.outcome import Outcome
from difftest.reduction.passes import config, lengths, modes, pool, requests, trades, values
from difftest.reduction.probe import ShrinkPass

VALUE_DEPENDENT = frozenset({Outcome.NONDETERMINISTIC})
"""Failures whose visibility depends on the values, for which the shrinker also moves lengths
and the seed together."""


def default_passes(kind: Outcome | None = None) -> list[ShrinkPass]:
    """Every pass, cheapest first (plus joint length-and-seed moves for ``VALUE_DEPENDENT``
    failures)."""
    reseed = [ShrinkPass("reseeded_prefixes", values.reseeded_prefixes)]
    return [
        ShrinkPass("drop_requests", requests.drop_requests),
        ShrinkPass("drop_padding", requests.drop_padding),
        ShrinkPass("real_for_padding", requests.real_for_padding),
        ShrinkPass("graph", modes.no_graph),
        ShrinkPass("graph_buffers", modes.smaller_graph),
        ShrinkPass("uniform_queries", modes.uniform_queries),
        ShrinkPass("new_tokens", modes.fewer_new_tokens),
        ShrinkPass("prefix_lens", lengths.shrink_prefixes),
        ShrinkPass("shared_prefix_pages", pool.no_shared_pages),
        ShrinkPass("spare_pages", pool.no_spare_pages),
        ShrinkPass("page_order", pool.identity_page_order),
        ShrinkPass("table_width", pool.exact_table),
        ShrinkPass("table_fill", pool.zero_table_fill),
        ShrinkPass("stale_fill", pool.zero_stale_fill),
        ShrinkPass("convention", pool.plain_convention),
        ShrinkPass("kv_storage", pool.hnd_storage),
        ShrinkPass("window_left", config.smaller_window),
        ShrinkPass("value_family", values.simplest_values),
        ShrinkPass("scales", values.default_scales),
        ShrinkPass("skip_softmax", modes.no_skip_softmax),
        ShrinkPass("seed", values.small_seed),
        ShrinkPass("trade_prefix", trades.trade_prefix),
        ShrinkPass("trade_request", trades.trade_request),
        *(reseed if kind in VALUE_DEPENDENT else []),
        ShrinkPass("q_len", lengths.shrink_q_len, expensive=True),
        ShrinkPass("q_len_into_prefix", lengths.trade_q_len_for_prefix, expensive=True),
        ShrinkPass("draft", config.causal_draft, expensive=True),
        ShrinkPass("draft_tokens", config.fewer_draft_tokens, expensive=True),
        ShrinkPass("window", config.no_window, expensive=True),
        ShrinkPass("sinks", config.no_sinks, expensive=True),
        ShrinkPass("dtypes", config.bf16_everywhere, expensive=True),
        ShrinkPass("kv_heads", config.fewer_kv_heads, expensive=True),
        ShrinkPass("group_size", config.smaller_group, expensive=True),
        ShrinkPass("head_dim", config.smaller_head_dim, expensive=True),
        ShrinkPass("page_size", config.smaller_page_size, expensive=True),
    ]
