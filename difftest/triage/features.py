"""The features of a case: what the generators vary and the shrinker resets, each with its
default and the one move that takes a case back to it.

A finding's *trigger* (:mod:`difftest.triage.trigger`) is written in this vocabulary, and so
are the triggers corpus entries declare for known bugs, the swarm's held-off features and the
avoidance of known triggers (:mod:`difftest.campaign.planning`).

Two kinds of feature:

- a **flag** is on or off (a window, sinks, an fp8 cache, ``bmm2_scale != 1``, a shuffled page
  order...); its name is written as it is (``"window"``) or with the value it has
  (``"kv_storage=nhd"``); its reset sets the default (no window; HND storage);
- a **size** (requests, the longest prefix, ``L``, KV heads, the GQA group, head dim, page
  size) is written as a threshold (``"prefix>128"``: the largest power of two below the
  value), so the same bug found at sizes 129 and 200 has one trigger; its reset is one step
  smaller (one request fewer, the longest prefix one token shorter, ``L - 1``...).

A flag's "default" is where the shrinker takes a case and the generators start: bf16, no
window, no sinks, a chain draft, default scales, the plain convention, an exact zero-filled
table with zeroed stale slots in HND storage, sequential pages, ``randn`` values at scale 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from difftest.model.case import BatchSpec, Case, CausalDraft, PoolSpec, TreeDraft, ValueSpec
from difftest.model.errors import InvalidCase

Kind = Literal["flag", "size"]


def _attn(case: Case, **changes: Any) -> Case:
    return case.replace(attention=dataclasses.replace(case.attention, **changes))


def _pool(case: Case, **changes: Any) -> Case:
    return case.replace(pool=dataclasses.replace(case.pool, **changes))


def _batch(case: Case, **changes: Any) -> Case:
    return case.replace(batch=dataclasses.replace(case.batch, **changes))


def threshold(value: int) -> int:
    """The largest power of two strictly below ``value`` (0 for 1): ``129 -> 128``."""
    if value <= 1:
        return 0
    return 1 << ((value - 1).bit_length() - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Feature:
    """One feature: its name, what it is in words, whether a case has it, how to reset it.

    ``value(case)``: ``None`` when the case is at the default; otherwise what to write
    after ``name`` (a flag's value, ``""`` for a bare flag; a size's magnitude).
    ``reset(case)``: the case one move closer to the default.
    """

    name: str
    kind: Kind
    words: str
    value: Callable[[Case], str | int | None]
    reset: Callable[[Case], Case]
    floor: int = 0
    """A size at or below this is at its default."""

    def label(self, case: Case) -> str | None:
        """How this feature appears in a trigger, for ``case`` (``None``: at its default)."""
        v = self.value(case)
        if v is None:
            return None
        if self.kind == "size":
            assert isinstance(v, int)
            if v <= self.floor:
                return None
            return f"{self.name}>{max(threshold(v), self.floor)}"
        return self.name if v == "" else f"{self.name}={v}"

    def reset_case(self, case: Case) -> Case | None:
        """The reset candidate, or ``None`` when the case model refuses it."""
        try:
            return self.reset(case)
        except InvalidCase:
            return None


def _flag(
    name: str, words: str, on: Callable[[Case], bool], reset: Callable[[Case], Case]
) -> Feature:
    return Feature(
        name=name, kind="flag", words=words, value=lambda c: "" if on(c) else None, reset=reset
    )


def _choice(
    name: str, words: str, get: Callable[[Case], str], default: str, reset: Callable[[Case], Case]
) -> Feature:
    return Feature(
        name=name,
        kind="flag",
        words=words,
        value=lambda c: None if get(c) == default else get(c),
        reset=reset,
    )


def _drop_last_request(case: Case) -> Case:
    """One request fewer: a CUDA-graph padding request if there is one (the kernel sees those
    as requests too), else the last real one."""
    b = case.batch
    if b.padding_requests:
        return _batch(case, padding_requests=b.padding_requests - 1)
    if b.q_lens is not None:
        return case.replace(batch=b.with_real_requests(b.prefix_lens[:-1], b.q_lens[:-1]))
    return _batch(case, prefix_lens=b.prefix_lens[:-1])


def _shorter_longest_prefix(case: Case) -> Case:
    lens = case.batch.prefix_lens
    longest = max(lens)
    return _batch(case, prefix_lens=tuple(p - 1 if p == longest else p for p in lens))


def _fewer_new_tokens(case: Case) -> Case:
    b = case.batch
    if b.q_lens is not None:  # every request at most L - 1
        return case.replace(
            batch=b.with_real_requests(b.prefix_lens, tuple(min(n, b.q_len - 1) for n in b.q_lens))
        )
    draft = b.draft
    if isinstance(draft, TreeDraft):
        draft = TreeDraft(parents=draft.parents[: b.q_len - 1])
    return _batch(case, q_len=b.q_len - 1, draft=draft)


def _fewer_kv_heads(case: Case) -> Case:
    a = case.attention
    n = a.num_kv_heads - 1
    return _attn(case, num_kv_heads=n, num_qo_heads=n * a.group_size)


def _smaller_group(case: Case) -> Case:
    a = case.attention
    return _attn(case, num_qo_heads=a.num_kv_heads * (a.group_size - 1))


def _smaller_power(value: int) -> int:
    return threshold(value) if value > 1 else value


def _graph(case: Case, **changes: Any) -> Case:
    assert case.graph is not None
    return case.replace(graph=dataclasses.replace(case.graph, **changes))


def _graph_value(case: Case, name: str) -> str | None:
    """A graph feature's label value: ``""`` when the graph has it, else ``None``."""
    g = case.graph
    if g is None:
        return None
    on = g.changes_scales if name == "scales" else getattr(g, f"extra_{name}") > 0
    return "" if on else None


def _no_draft_len(case: Case) -> BatchSpec:
    """The batch without SGLang's draft length (only the SGLang convention has one)."""
    return dataclasses.replace(case.batch, spec_draft_len=None)


def _sixteen_bit(case: Case) -> Case:
    a = case.attention
    kv = a.kv_dtype if a.kv_dtype == "fp8_e4m3" else "bf16"
    return _attn(case, q_dtype="bf16", kv_dtype=kv, out_dtype="bf16")


FEATURES: tuple[Feature, ...] = (
    # sizes past kernel thresholds
    Feature(
        name="requests",
        kind="size",
        words="more than {t} requests (padding ones included)",
        value=lambda c: c.batch.num_requests,
        reset=_drop_last_request,
        floor=1,
    ),
    Feature(
        name="prefix",
        kind="size",
        words="a prefix longer than {t} tokens",
        value=lambda c: max(c.batch.prefix_lens),
        reset=_shorter_longest_prefix,
    ),
    Feature(
        name="L",
        kind="size",
        words="more than {t} new tokens per request",
        value=lambda c: c.batch.q_len,
        reset=_fewer_new_tokens,
        floor=1,
    ),
    Feature(
        name="kv_heads",
        kind="size",
        words="more than {t} KV heads",
        value=lambda c: c.attention.num_kv_heads,
        reset=_fewer_kv_heads,
        floor=1,
    ),
    Feature(
        name="group",
        kind="size",
        words="more than {t} query heads per KV head",
        value=lambda c: c.attention.group_size,
        reset=_smaller_group,
        floor=1,
    ),
    Feature(
        name="head_dim",
        kind="size",
        words="a head dim above {t}",
        value=lambda c: c.attention.head_dim,
        reset=lambda c: _attn(c, head_dim=_smaller_power(c.attention.head_dim)),
        floor=16,
    ),
    Feature(
        name="page_size",
        kind="size",
        words="pages of more than {t} tokens",
        value=lambda c: c.attention.page_size,
        reset=lambda c: _attn(c, page_size=_smaller_power(c.attention.page_size)),
        floor=1,
    ),
    # the attention configuration
    _flag(
        "window",
        "a sliding window",
        lambda c: c.attention.window_left >= 0,
        lambda c: _attn(c, window_left=-1),
    ),
    _flag("sinks", "attention sinks", lambda c: c.attention.sinks, lambda c: _attn(c, sinks=False)),
    _flag(
        "kv_fp8",
        "an fp8 (e4m3) KV cache",
        lambda c: c.attention.kv_dtype == "fp8_e4m3",
        lambda c: _attn(c, kv_dtype=c.attention.q_dtype),
    ),
    _flag(
        "fp16",
        "fp16 instead of bf16",
        lambda c: "fp16" in (c.attention.q_dtype, c.attention.kv_dtype, c.attention.out_dtype),
        _sixteen_bit,
    ),
    _flag(
        "sm_scale",
        "a softmax scale other than head_dim ** -0.5",
        lambda c: c.attention.sm_scale is not None,
        lambda c: _attn(c, sm_scale=None),
    ),
    _flag(
        "q_scale",
        "q_scale != 1",
        lambda c: c.attention.q_scale != 1.0,
        lambda c: _attn(c, q_scale=1.0),
    ),
    _flag(
        "k_scale",
        "k_scale != 1",
        lambda c: c.attention.k_scale != 1.0,
        lambda c: _attn(c, k_scale=1.0),
    ),
    _flag(
        "bmm2_scale",
        "bmm2_scale (v_scale / o_scale) != 1",
        lambda c: c.attention.v_scale != 1.0 or c.attention.o_scale != 1.0,
        lambda c: _attn(c, v_scale=1.0, o_scale=1.0),
    ),
    _flag(
        "draft=tree",
        "a tree draft mask",
        lambda c: isinstance(c.batch.draft, TreeDraft),
        lambda c: _batch(c, draft=CausalDraft()),
    ),
    _flag(
        "padding_requests",
        "CUDA-graph padding requests",
        lambda c: c.batch.padding_requests > 0,
        lambda c: _batch(c, padding_requests=0),
    ),
    _flag(
        "padding_rows",
        "data-parallel padding rows",
        lambda c: c.batch.padding_rows > 0,
        lambda c: _batch(c, padding_rows=0),
    ),
    _flag(
        "spec_draft_len",
        "SGLang's XQA mask buffer sized by a speculative draft length longer than L",
        lambda c: c.batch.spec_draft_len is not None,
        lambda c: _batch(c, spec_draft_len=None),
    ),
    # the production modes
    _flag(
        "ragged",
        "requests with different numbers of new tokens (ragged verify)",
        lambda c: c.batch.is_ragged,
        lambda c: _batch(c, q_lens=None),
    ),
    _flag(
        "skip_softmax",
        "skip_softmax_threshold_scale_factor set",
        lambda c: c.attention.skip_softmax_threshold_scale_factor is not None,
        lambda c: _attn(c, skip_softmax_threshold_scale_factor=None),
    ),
    _flag(
        "graph",
        "a CUDA-graph replay",
        lambda c: c.graph is not None,
        lambda c: c.replace(graph=None),
    ),
    Feature(
        name="graph_columns",
        kind="flag",
        words="stale page-table columns in a graph's static table",
        value=lambda c: _graph_value(c, "columns"),
        reset=lambda c: _graph(c, extra_columns=0),
    ),
    Feature(
        name="graph_pages",
        kind="flag",
        words="stale pages in a graph's static pool",
        value=lambda c: _graph_value(c, "pages"),
        reset=lambda c: _graph(c, extra_pages=0),
    ),
    Feature(
        name="graph_requests",
        kind="flag",
        words="static batch rows past the case's requests",
        value=lambda c: _graph_value(c, "requests"),
        reset=lambda c: _graph(c, extra_requests=0),
    ),
    Feature(
        name="graph_max_seq_len",
        kind="flag",
        words="a graph captured with a longer max_seq_len",
        value=lambda c: _graph_value(c, "max_seq_len"),
        reset=lambda c: _graph(c, extra_max_seq_len=0),
    ),
    Feature(
        name="graph_scales",
        kind="flag",
        words="a graph captured with other scales",
        value=lambda c: _graph_value(c, "scales"),
        reset=lambda c: _graph(c, bmm1_scale=None, bmm2_scale=None),
    ),
    # the paged pool and the calling convention
    _choice(
        "page_order",
        "pages out of order",
        lambda c: c.pool.page_order,
        "sequential",
        lambda c: _pool(c, page_order="sequential"),
    ),
    _flag(
        "shared_pages",
        "prefix pages shared between requests",
        lambda c: c.pool.shared_prefix_pages > 0,
        lambda c: _pool(c, shared_prefix_pages=0),
    ),
    _flag(
        "spare_pages",
        "pool pages no request uses",
        lambda c: c.pool.spare_pages > 0,
        lambda c: _pool(c, spare_pages=0),
    ),
    _flag(
        "table_width=context",
        "a page table as wide as the context length",
        lambda c: c.pool.table_width == "context" or c.pool.context_len is not None,
        lambda c: _pool(c, table_width="exact", context_len=None),
    ),
    _choice(
        "table_fill",
        "table columns past the used pages filled",
        lambda c: c.pool.table_fill,
        "zero",
        lambda c: _pool(c, table_fill="zero"),
    ),
    _choice(
        "stale_fill",
        "stale data in unused slots",
        lambda c: c.pool.stale_fill,
        "zeros",
        lambda c: _pool(c, stale_fill="zeros"),
    ),
    _choice(
        "kv_storage",
        "a KV storage other than one HND tensor",
        lambda c: c.pool.kv_storage,
        "hnd",
        lambda c: _pool(c, kv_storage="hnd"),
    ),
    _choice(
        "convention",
        "SGLang's calling convention",
        lambda c: c.convention,
        "plain",
        lambda c: c.replace(convention="plain", batch=_no_draft_len(c)),
    ),
    _choice(
        "values",
        "a value family other than randn",
        lambda c: c.values.family,
        "randn",
        lambda c: c.replace(values=dataclasses.replace(c.values, family="randn")),
    ),
    _flag(
        "value_scale",
        "values at a scale other than 1",
        lambda c: c.values.scale != 1.0,
        lambda c: c.replace(values=dataclasses.replace(c.values, scale=1.0)),
    ),
)
"""Every feature, sizes first."""

BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}

DEFAULT_POOL = PoolSpec()
DEFAULT_VALUES = ValueSpec()


def feature_of_label(label: str) -> Feature | None:
    """The feature a trigger label names (``"prefix>128"`` -> ``prefix``)."""
    name = label.split(">", 1)[0].split("=", 1)[0]
    return BY_NAME.get(name)


def labels(case: Case) -> tuple[str, ...]:
    """Every feature ``case`` has, as trigger labels, in vocabulary order."""
    return tuple(label for f in FEATURES if (label := f.label(case)) is not None)


def has(case: Case, label: str) -> bool:
    """Whether ``case`` has the feature ``label`` names: a flag with that value, or a size
    above that threshold."""
    feature = feature_of_label(label)
    if feature is None:
        return False
    value = feature.value(case)
    if value is None:
        return False
    if feature.kind == "size":
        assert isinstance(value, int)
        limit = int(label.split(">", 1)[1]) if ">" in label else feature.floor
        return value > max(limit, feature.floor)
    return label == (feature.name if value == "" else f"{feature.name}={value}")


def matches(case: Case, trigger: tuple[str, ...]) -> bool:
    """Whether ``case`` has every feature of ``trigger`` (an empty trigger matches all)."""
    return all(has(case, label) for label in trigger)


def describe(trigger: tuple[str, ...]) -> str:
    """A trigger in words: ``"a sliding window and bmm2_scale (v_scale / o_scale) != 1"``."""
    if not trigger:
        return "any case (no feature needed)"
    parts = []
    for label in trigger:
        feature = feature_of_label(label)
        if feature is None:
            parts.append(label)
        elif feature.kind == "size":
            parts.append(feature.words.format(t=label.split(">", 1)[1]))
        elif "=" in label:
            parts.append(f"{feature.words} ({label.split('=', 1)[1]})")
        else:
            parts.append(feature.words)
    return " and ".join(parts)


def reset_all(case: Case, trigger: tuple[str, ...]) -> Case | None:
    """``case`` with every feature of ``trigger`` absent: flags at their default, sizes at
    their threshold. ``None`` when the case model refuses it."""
    out: Case | None = case
    for label in trigger:
        feature = feature_of_label(label)
        if feature is None or out is None or not has(out, label):
            continue
        if feature.kind == "size":
            out = _size_to(feature, out, int(label.split(">", 1)[1]))
        else:
            out = feature.reset_case(out)
    return out


def _size_to(feature: Feature, case: Case, limit: int) -> Case | None:
    """``case`` with ``feature`` at most ``limit`` (``None``: the case model refuses it)."""
    try:
        if feature.name == "prefix":
            lens = tuple(min(p, limit) for p in case.batch.prefix_lens)
            return _batch(case, prefix_lens=lens)
        if feature.name == "requests":
            b = case.batch
            keep = max(limit, 1)
            real = b.prefix_lens[:keep]
            padding = max(0, min(b.padding_requests, limit - len(real)))
            if b.q_lens is not None:
                fewer = b.with_real_requests(real, b.q_lens[:keep])
                return case.replace(batch=dataclasses.replace(fewer, padding_requests=padding))
            return _batch(case, prefix_lens=real, padding_requests=padding)
    except InvalidCase:
        return None
    out: Case | None = case
    for _ in range(64):
        if out is None:
            return None
        value = feature.value(out)
        if not isinstance(value, int) or value <= max(limit, feature.floor):
            return out
        out = feature.reset_case(out)
    return None
