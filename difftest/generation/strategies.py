"""Hypothesis strategies that produce only valid cases.

Constraints hold by construction (lengths are drawn before what depends on them), never by
filtering. Every choice is ordered so Hypothesis shrinks toward the simple case: fewer and
shorter requests, ``L = 2``, no window, no sinks, bf16, a chain draft, identity pages, the
plain convention, the ``randn`` family, default scales. Sizes are bounded by :class:`Limits`
(a CPU gets small cases, a GPU large ones) through the work a case needs, so one strategy
serves both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from difftest.generation.choices import Choices, composite
from difftest.generation.modes import NO_MODES, Modes, moded_case, ragged_counts
from difftest.generation.presets import PRESETS, XQA_TEST_SHAPE, Preset
from difftest.generation.values import FAMILIES
from difftest.model.case import (
    PADDING_PREFIX_LEN,
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    DraftSpec,
    PageOrder,
    PoolSpec,
    StaleFill,
    TableFill,
    TreeDraft,
    ValueSpec,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How large generated cases may get. ``max_work`` bounds what one case costs; the other
    limits bound each dimension, and are wide on purpose: a tier reaches long prefixes and
    many requests too, with small heads, so bugs that need scale are found without a GPU."""

    max_requests: int = 96
    max_prefix: int = 16_384
    max_q_len: int = 8
    max_work: int = 2_500_000
    """Bound on ``total KV tokens * L * H_q * D`` (multiply-adds of ``Q K^T``)."""
    typical_requests: int = 8
    """The most requests of a *typical* case (long and wide ones reach further)."""
    typical_prefix: int = 512
    """The longest prefix of a *typical* case."""
    long_share: int = 10
    """Percent of generic cases drawn *long* (one request, a prefix of 8192 tokens or more,
    past every split-KV threshold) and as many *wide* (64 requests or more, short prefixes),
    with one query head and a head dim of 16 or 32 so they stay within ``max_work``."""
    min_requests: int = 1
    min_q_len: int = 2
    padding: bool = True
    """Whether batches may carry padding requests and rows (CUDA-graph padding)."""
    shape: Preset | None = None
    """The attention configuration every case has (``None``: drawn), as if it were the
    ``preset`` of :func:`cases`."""
    gpu_pack: int = 8
    """Cases a GPU launch packs by default at these sizes (``--pack`` overrides; a CPU packs
    none): at the GPU limits a case's pool can reach GiBs, and eight of them are what a launch
    may hold; smaller cases share the launch's fixed cost among more."""


CPU_LIMITS = Limits()
GPU_LIMITS = Limits(
    max_requests=256,
    max_prefix=100_000,
    max_work=4_000_000_000,
    typical_requests=64,
    typical_prefix=20_000,
)
SMALL_LIMITS = Limits(
    max_requests=4,
    min_requests=4,
    max_prefix=110,
    typical_prefix=110,
    max_q_len=4,
    min_q_len=4,
    typical_requests=4,
    long_share=0,
    padding=False,
    shape=XQA_TEST_SHAPE,
    gpu_pack=64,
)
"""FlashInfer's ``test_xqa_batch_decode`` cases (its first parametrisation): 4 requests,
``L = 4``, at most 110 prefix tokens, and :data:`~difftest.generation.presets.XQA_TEST_SHAPE`,
for a like-for-like rate against that test. A GPU launch packs 64 of them (256 requests, the GPU
limits' most in one case): a launch's fixed host cost (its oracle and judgement calls, each
path's library call) then weighs on each case an eighth of what it does in launches of 8, and
what is left is the cases' own (each case's placement and generation calls)."""
LIMITS = {"cpu": CPU_LIMITS, "gpu": GPU_LIMITS, "small": SMALL_LIMITS}
"""The named limits ``--limits`` selects."""
LONG_PREFIX = 8192
"""The shortest prefix of a *long* case."""
WIDE_REQUESTS = 64
"""The fewest requests of a *wide* case."""
Shape = str
"""``typical``, ``long`` or ``wide`` (see :attr:`Limits.long_share`)."""

SCALES = (1.0, 0.5, 2.0, 0.125, 4.0)
GENERIC_HEADS = ((1, 1), (2, 1), (4, 1), (8, 2), (4, 4), (8, 1), (16, 1), (16, 4), (32, 8))
GENERIC_HEAD_DIMS = (64, 128, 256, 32, 16, 96, 80)
PAGE_SIZES = (16, 32, 64, 128, 8, 1)
PAGE_ORDERS: tuple[PageOrder, ...] = ("sequential", "reversed", "shuffled")
TABLE_FILLS: tuple[TableFill, ...] = ("zero", "stale_pages", "out_of_range")
STALE_FILLS: tuple[StaleFill, ...] = ("zeros", "randn", "large")


def _scale(ch: Choices) -> float:
    """A positive quantisation scale across the useful range (powers of two and others)."""
    if ch.flag():
        return ch.real(2.0**-8, 8.0)
    return ch.pick((0.5, 0.25, 2.0, 0.0625, 4.0))


def draw_scales(ch: Choices, fp8: bool) -> dict[str, Any]:
    """Scales across their valid range; an fp8 cache always has k and v scales."""
    scales: dict[str, Any] = {}
    if fp8 or ch.flag():
        scales = {"k_scale": _scale(ch), "v_scale": _scale(ch)}
    if ch.flag():
        scales["sm_scale"] = ch.real(1e-3, 1.0)
    if ch.flag():
        scales["q_scale"] = _scale(ch)
        scales["o_scale"] = _scale(ch)
    return scales


def attention_config(ch: Choices, preset: Preset | None = None) -> AttentionConfig:
    """An attention configuration: generic (``preset`` ``None``) or one of ``preset``'s."""
    if preset is None:
        hq, hkv = ch.pick(GENERIC_HEADS)
        head_dim = ch.pick(GENERIC_HEAD_DIMS)
    else:
        hq, hkv = ch.pick(preset.heads[::-1])  # shrink toward the smallest rank
        head_dim = preset.head_dim
    q_dtype: Any = ch.pick(["bf16", "fp16"] if preset is None else preset.q_dtypes)
    fp8 = preset is None or preset.fp8_kv
    kv_dtype: Any = ch.pick([q_dtype, "fp8_e4m3"] if fp8 else [q_dtype])
    scales = draw_scales(ch, kv_dtype == "fp8_e4m3")
    sinks = ch.flag() if preset is None else preset.sinks and ch.flag()
    return AttentionConfig(
        num_qo_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        page_size=ch.pick(PAGE_SIZES if preset is None else preset.page_sizes),
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        out_dtype=q_dtype,
        sinks=sinks,
        **scales,
    )


attention_configs = composite(attention_config)


def tree_draft(ch: Choices, q_len: int) -> DraftSpec:
    """A tree draft: each token's parent is an earlier token (shrinks toward a star)."""
    parents = [-1] + [ch.integer(0, i - 1) for i in range(1, q_len)]
    return TreeDraft(parents=tuple(parents))


def template_case(
    ch: Choices,
    *,
    preset: Preset | str | None = None,
    mode: str | None = None,
    limits: Limits = CPU_LIMITS,
    modes: Modes = NO_MODES,
) -> Case:
    """A valid :class:`Case`, every choice made: a campaign's template (a compile variant).
    ``preset``: a model preset (name or value) or ``None`` for any configuration (presets and
    generic ones); ``mode``: fix the mode; ``modes``: the production modes the case uses."""
    if isinstance(preset, str):
        preset = PRESETS[preset]
    if preset is None:
        preset = limits.shape
    shape: Shape = "typical"
    if preset is None:
        share = max(0, min(limits.long_share, 50))
        shape = ch.pick(["typical"] * (100 - 2 * share) + ["long"] * share + ["wide"] * share)
        if shape == "typical" and ch.flag():
            preset = ch.pick(list(PRESETS.values()))
    if shape == "typical":
        attn = attention_config(ch, preset)
        q_len = ch.integer(max(2, limits.min_q_len), max(2, limits.max_q_len))
    else:
        attn = small_heads(ch)
        q_len = ch.integer(2, max(2, min(4, limits.max_q_len)))
    if preset is not None and len(preset.windows) > 1:
        windowed = ch.pick(preset.windows) >= 0
    else:
        windowed = ch.flag()
    tree = ch.flag()
    case = runtime_case(ch, attn, q_len, windowed, tree, mode, limits, preset, shape)
    # No choice at all without modes: even an empty one would change what comes next.
    return moded_case(ch, case, modes) if modes != NO_MODES else case


cases = composite(template_case)
"""Hypothesis's strategy of :func:`template_case`: ``cases(preset=..., limits=...)``."""


def small_heads(ch: Choices) -> AttentionConfig:
    """One query head per KV head, head dim 16 or 32, pages of 16 to 64 tokens: what keeps a
    long or wide case within the work bound."""
    q_dtype: Any = ch.pick(["bf16", "fp16"])
    kv_dtype: Any = ch.pick([q_dtype, "fp8_e4m3"])
    return AttentionConfig(
        num_qo_heads=1,
        num_kv_heads=1,
        head_dim=ch.pick([16, 32]),
        page_size=ch.pick([16, 32, 64]),
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        out_dtype=q_dtype,
        sinks=ch.flag(),
        **draw_scales(ch, kv_dtype == "fp8_e4m3"),
    )


def variation_case(
    ch: Choices,
    template: Case,
    limits: Limits = CPU_LIMITS,
    mode: str | None = None,
    modes: Modes = NO_MODES,
) -> Case:
    """A case that shares ``template``'s compile variant (heads, head dim, dtypes, page size,
    ``L``, window on/off, sinks, draft kind) and varies everything a kernel takes at run time:
    requests, lengths, pool layout, window size, scales, values, seed, and the mode (unless
    ``mode`` fixes it: both modes have the same kernel-level shape)."""
    a = template.attention
    fixed = AttentionConfig(
        num_qo_heads=a.num_qo_heads,
        num_kv_heads=a.num_kv_heads,
        head_dim=a.head_dim,
        page_size=a.page_size,
        q_dtype=a.q_dtype,
        kv_dtype=a.kv_dtype,
        out_dtype=a.out_dtype,
        sinks=a.sinks,
    )
    attn = dataclasses.replace(fixed, **draw_scales(ch, fixed.kv_dtype == "fp8_e4m3"))
    case = runtime_case(
        ch,
        attn,
        template.batch.q_len,
        a.window_left >= 0,
        template.batch.draft.kind == "tree",
        mode,
        limits,
        None,
    )
    return case if modes == NO_MODES else moded_case(ch, case, modes)


def runtime_case(
    ch: Choices,
    attn: AttentionConfig,
    q_len: int,
    windowed: bool,
    tree: bool,
    mode: str | None,
    limits: Limits,
    preset: Preset | None,
    shape: Shape = "typical",
) -> Case:
    """Everything that is a runtime argument, drawn for a fixed compile variant."""
    ps = attn.page_size
    per_token = q_len * attn.num_qo_heads * attn.head_dim
    token_budget = max(1, limits.max_work // per_token)
    if shape == "long" and min(limits.max_prefix, token_budget - q_len) >= LONG_PREFIX:
        n_req = 1
        prefix_lens: tuple[int, ...] = (
            ch.integer(LONG_PREFIX, min(limits.max_prefix, token_budget - q_len)),
        )
    elif shape == "wide" and min(limits.max_requests, token_budget // (q_len + 1)) >= WIDE_REQUESTS:
        n_req = ch.integer(WIDE_REQUESTS, min(limits.max_requests, token_budget // (q_len + 1)))
        short = max(0, min(3 * ps, token_budget // n_req - q_len))
        prefix_lens = tuple(ch.integer(0, short) for _ in range(n_req))
    else:
        most = min(limits.max_requests, limits.typical_requests, token_budget // (q_len + 1))
        least = max(1, limits.min_requests)
        n_req = ch.integer(least, max(least, most))
        max_prefix = max(
            0, min(limits.max_prefix, limits.typical_prefix, token_budget // n_req - q_len)
        )
        prefix_lens = tuple(
            ch.integer(0, max_prefix if ch.flag() else min(max_prefix, 3 * ps))
            for _ in range(n_req)
        )
    chosen_mode: Any = mode or ch.pick(("target_verify", "draft_extend_v2"))
    batch = BatchSpec(
        mode=chosen_mode,
        prefix_lens=prefix_lens,
        q_len=q_len,
        draft=tree_draft(ch, q_len) if tree else CausalDraft(),
        padding_requests=ch.integer(0, 2) if limits.padding else 0,
        padding_rows=ch.integer(0, 2 * q_len) if limits.padding else 0,
    )
    longest = max(batch.seq_lens())
    window = -1
    if windowed:
        preset_windows = [w for w in (preset.windows if preset else ()) if w >= 0]
        window = ch.pick(preset_windows) if preset_windows else ch.integer(0, longest + 2)
    attn = dataclasses.replace(attn, window_left=window)
    shared_max = min(prefix_lens) // ps if n_req > 1 else 0
    table_width: Any = ch.pick(("exact", "context"))
    pool = PoolSpec(
        kv_storage=ch.pick(("hnd", "nhd", "kv_split_nhd")),
        page_order=ch.pick(PAGE_ORDERS),
        spare_pages=ch.integer(0, 4),
        shared_prefix_pages=ch.integer(0, shared_max),
        table_width=table_width,
        table_fill=ch.pick(TABLE_FILLS),
        stale_fill=ch.pick(STALE_FILLS),
        context_len=None if table_width == "exact" else longest + ch.integer(0, 4 * ps),
    )
    values = ValueSpec(family=ch.pick(FAMILIES), scale=ch.pick(SCALES))
    return Case(
        attention=attn,
        batch=batch,
        pool=pool,
        values=values,
        convention=ch.pick(("plain", "sglang")),
        seed=ch.integer(0, 2**32 - 1),
    )


runtime_variations = composite(variation_case)
"""Hypothesis's strategy of :func:`variation_case` (campaigns use :class:`SeededChoices
<difftest.generation.choices.SeededChoices>` for these)."""


def partner_case(
    ch: Choices, template: Case, limits: Limits = CPU_LIMITS, mode: str | None = None
) -> Case:
    """A case that may share a kernel launch with ``template`` (equal
    :func:`difftest.execution.packing.pack_key`), with its own requests, pool and values.

    Kept: the attention configuration (scales and window included), ``L``, the draft, the
    storage layout, the convention, the table-width rule and context length, and (with sinks,
    which are one per launch) the values and seed. The longest sequence is kept too, because
    it sets the table width and ``max_seq_len``: one request has the template's longest
    prefix. No padding query rows (only a launch's last case may have them). The partner of a
    ragged template (a ragged verify launch) has its own new-token counts when it has two or
    more requests (without that, a packed ragged launch would be one ragged case among
    uniform ones), and one request reaches the template's longest ``T = P + L_b``.
    """
    a, tb = template.attention, template.batch
    longest = max(tb.all_prefix_lens())
    per_token = tb.q_len * a.num_qo_heads * a.head_dim
    budget = max(1, limits.max_work // per_token)
    most = max(1, min(limits.max_requests, budget // (longest + tb.q_len)))
    n_req = ch.integer(1, most)
    others = [ch.integer(0, longest) for _ in range(n_req - 1)]
    at = ch.integer(0, n_req - 1)
    prefix_lens = tuple([*others[:at], longest, *others[at:]])
    if tb.spec_draft_len is not None:  # the mask buffer is launch-wide: same mode, same size
        chosen_mode: Any = tb.mode
    else:
        chosen_mode = mode or ch.pick(("target_verify", "draft_extend_v2"))
    batch = BatchSpec(
        mode=chosen_mode,
        prefix_lens=prefix_lens,
        q_len=tb.q_len,
        draft=tb.draft,
        padding_requests=ch.integer(0, 2) if longest >= 1 and limits.padding else 0,
        spec_draft_len=tb.spec_draft_len,
    )
    if tb.q_lens is not None:  # a ragged launch: the same longest sequence, T = P + L_b
        top = max(tb.seq_lens())
        counts = ragged_counts(ch, n_req, tb.q_len) if n_req >= 2 else (tb.q_len,)
        fitted = [min(p, top - c) for p, c in zip(prefix_lens, counts, strict=True)]
        fitted[at] = top - counts[at]
        batch = dataclasses.replace(
            batch,
            prefix_lens=tuple(fitted),
            q_lens=counts if n_req >= 2 else None,
            # a padding request (its prefix, then L rows) must not be the longest sequence
            padding_requests=batch.padding_requests if top >= PADDING_PREFIX_LEN + tb.q_len else 0,
        )
    ps = a.page_size
    pool = dataclasses.replace(
        template.pool,
        page_order=ch.pick(PAGE_ORDERS),
        spare_pages=ch.integer(0, 4),
        shared_prefix_pages=ch.integer(0, min(prefix_lens) // ps if n_req > 1 else 0),
        table_fill=ch.pick(TABLE_FILLS),
        stale_fill=ch.pick(STALE_FILLS),
    )
    if a.sinks:
        values, seed = template.values, template.seed
    else:
        values = ValueSpec(family=ch.pick(FAMILIES), scale=ch.pick(SCALES))
        seed = ch.integer(0, 2**32 - 1)
    return template.replace(batch=batch, pool=pool, values=values, seed=seed)


launch_partners = composite(partner_case)
"""Hypothesis's strategy of :func:`partner_case` (campaigns use :class:`SeededChoices
<difftest.generation.choices.SeededChoices>` for these)."""
