"""Tiny cases whose expected output is computed by hand or by an explicit scalar loop.

Most cases use ``q = 0`` (every visible key gets the same weight) and *position-coded* values:
token ``t`` of request ``b`` has the one-hot value ``e_{offset_b + t}``, so the output row is
``1/n`` exactly on the coordinates of the keys it saw and 0 elsewhere. A wrong causal offset,
window edge, mask, row placement or an attended stale slot shows up as a wrong coordinate set.
"""

from __future__ import annotations

import math

import pytest
import torch
from _paged import paginate

from difftest.oracle.attention import paged_attention_reference

F64 = torch.float64


def coded_requests(
    lengths: list[int], h_kv: int = 1
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """Zero keys and one-hot values coded by global token id; returns ks, vs, offsets."""
    dim = sum(lengths)
    ks, vs, offsets = [], [], []
    offset = 0
    for n in lengths:
        ks.append(torch.zeros(n, h_kv, dim, dtype=F64))
        v = torch.zeros(n, h_kv, dim, dtype=F64)
        for t in range(n):
            v[t, :, offset + t] = 1.0
        vs.append(v)
        offsets.append(offset)
        offset += n
    return ks, vs, offsets


def uniform_row(dim: int, seen: list[int], weight: float | None = None) -> torch.Tensor:
    """The expected output row: ``1/len(seen)`` (or ``weight``) on ``seen``, 0 elsewhere."""
    row = torch.zeros(dim, dtype=F64)
    for c in seen:
        row[c] = 1.0 / len(seen) if weight is None else weight
    return row


def run(
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    q: torch.Tensor,
    q_len: int,
    page_size: int,
    **kw: object,
) -> torch.Tensor:
    paged_kw = {k: kw.pop(k) for k in list(kw) if k in ("stale", "extra_columns", "nhd_view")}
    p = paginate(ks, vs, page_size, **paged_kw)
    kw.setdefault("bmm1_scale", 1.0)
    kw.setdefault("bmm2_scale", 1.0)
    return paged_attention_reference(
        q,
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        q_len,
        **kw,
    )


def assert_rows(out: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("prefix", [0, 1, 5])
@pytest.mark.parametrize("q_len", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 3, 4])
def test_causal_offset_row_i_sees_prefix_plus_i_plus_1(
    prefix: int, q_len: int, page_size: int
) -> None:
    n = prefix + q_len
    ks, vs, _ = coded_requests([n])
    q = torch.zeros(q_len, 1, n, dtype=F64)
    out = run(ks, vs, q, q_len, page_size)
    expected = torch.stack([uniform_row(n, list(range(prefix + i + 1))) for i in range(q_len)])
    assert_rows(out[:, 0], expected)


def test_rows_of_later_requests_are_in_their_own_place() -> None:
    prefixes, q_len = [2, 0, 5], 2
    lengths = [p + q_len for p in prefixes]
    ks, vs, offsets = coded_requests(lengths)
    dim = sum(lengths)
    q = torch.zeros(len(prefixes) * q_len, 1, dim, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=2)
    for b, prefix in enumerate(prefixes):
        for i in range(q_len):
            seen = [offsets[b] + j for j in range(prefix + i + 1)]
            assert_rows(out[b * q_len + i, 0], uniform_row(dim, seen))


@pytest.mark.parametrize("window", [0, 1, 2, 5, 6, 100])
def test_window_edge_is_inclusive(window: int) -> None:
    prefix, q_len = 5, 2
    n = prefix + q_len
    ks, vs, _ = coded_requests([n])
    q = torch.zeros(q_len, 1, n, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=3, window_left=window)
    for i in range(q_len):
        pos = prefix + i
        seen = [j for j in range(n) if pos - window <= j <= pos]
        assert_rows(out[i, 0], uniform_row(n, seen))
        if pos - window >= 0:
            assert out[i, 0, pos - window] > 0  # the edge key itself is visible
        if pos - window - 1 >= 0:
            assert out[i, 0, pos - window - 1] == 0  # the one before it is not


def test_sinks_are_per_query_head_and_only_in_the_denominator() -> None:
    prefix, q_len, h_q, h_kv = 3, 2, 4, 2
    n = prefix + q_len
    ks, vs, _ = coded_requests([n], h_kv=h_kv)
    sinks = torch.tensor([0.0, 1.0, -1.0, 2.0], dtype=torch.float32)  # distinct per q head
    q = torch.zeros(q_len, h_q, n, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=2, sinks=sinks)
    for i in range(q_len):
        seen = list(range(prefix + i + 1))
        for h in range(h_q):
            # All logits are 0: p_j = exp(0) / (len(seen) * exp(0) + exp(sink_h)).
            weight = 1.0 / (len(seen) + math.exp(float(sinks[h])))
            assert_rows(out[i, h], uniform_row(n, seen, weight))


@pytest.mark.parametrize(
    ("logit", "sink", "dtype"),
    [
        (1000.0, 0.0, torch.float64),
        (-800.0, -790.0, torch.float64),
        (0.0, 90.0, torch.float32),  # exp(90) overflows float32 unless the sink joins the max
        (0.0, 12.0, torch.float16),  # exp(12) overflows float16 likewise
    ],
)
def test_sinks_join_the_row_max(logit: float, sink: float, dtype: torch.dtype) -> None:
    # One key with logit `logit` and value 1: out = 1 / (1 + exp(sink - logit)).
    ks = [torch.ones(1, 1, 1, dtype=F64)]
    vs = [torch.ones(1, 1, 1, dtype=F64)]
    q = torch.full((1, 1, 1), logit, dtype=F64)
    out = run(ks, vs, q, 1, page_size=1, sinks=torch.tensor([sink]), compute_dtype=dtype)
    expected = 1.0 / (1.0 + math.exp(sink - logit))
    assert out.dtype == dtype
    assert out.item() == pytest.approx(expected, rel=1e-12 if dtype == F64 else 1e-2)


@pytest.mark.parametrize(("h_q", "h_kv"), [(4, 2), (8, 2), (6, 3), (4, 1), (2, 2)])
def test_gqa_value_head_is_h_div_group(h_q: int, h_kv: int) -> None:
    ks = [torch.zeros(1, h_kv, 2, dtype=F64)]
    v = torch.zeros(1, h_kv, 2, dtype=F64)
    for c in range(h_kv):
        v[0, c] = torch.tensor([c + 1.0, -(c + 1.0)])  # KV head c carries the value c + 1
    q = torch.zeros(1, h_q, 2, dtype=F64)
    out = run(ks, [v], q, 1, page_size=1)
    group = h_q // h_kv
    for h in range(h_q):
        assert out[0, h].tolist() == [h // group + 1.0, -(h // group + 1.0)]


def test_gqa_key_head_is_h_div_group() -> None:
    # k is [T=2, H_kv=2, D=2]: KV head 0 prefers key 0 (logits 3, 0), KV head 1 key 1 (0, 3).
    k = torch.tensor([[[3.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [3.0, 0.0]]], dtype=F64)
    v = torch.tensor([[[1.0, 0.0]] * 2, [[0.0, 1.0]] * 2], dtype=F64)  # one-hot by key
    q = torch.tensor([1.0, 0.0], dtype=F64).expand(1, 4, 2)
    out = run([k], [v], q, 1, page_size=2)
    big, small = math.exp(3.0) / (1 + math.exp(3.0)), 1 / (1 + math.exp(3.0))
    for h in range(4):
        expected = [big, small] if h // 2 == 0 else [small, big]
        assert out[0, h].tolist() == pytest.approx(expected, rel=1e-14)


def expected_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: int, s1: float, s2: float
) -> list[list[list[float]]]:
    """Scalar loop, one request, plain causal, H_q == H_kv: ``[L][H][D]``."""
    n, heads, dim = k.shape
    rows = []
    for i in range(q_len):
        pos = n - q_len + i  # keys 0..pos are visible
        per_head = []
        for h in range(heads):
            logits = []
            for j in range(pos + 1):
                logits.append(
                    s1 * math.fsum(q[i, h, c].item() * k[j, h, c].item() for c in range(dim))
                )
            top = max(logits)
            e = [math.exp(x - top) for x in logits]
            out = []
            for c in range(dim):
                out.append(
                    s2 * math.fsum(e[j] * v[j, h, c].item() for j in range(pos + 1)) / sum(e)
                )
            per_head.append(out)
        rows.append(per_head)
    return rows


@pytest.mark.parametrize("bmm1_scale", [0.5, 2.0, -3.0, 0.125])
def test_bmm1_scale_multiplies_the_logits(bmm1_scale: float) -> None:
    k = torch.tensor([[[0.0]], [[1.0]]], dtype=F64)  # logits 0 and bmm1_scale
    v = torch.tensor([[[0.0]], [[1.0]]], dtype=F64)
    out = run([k], [v], torch.ones(1, 1, 1, dtype=F64), 1, page_size=2, bmm1_scale=bmm1_scale)
    expected = math.exp(bmm1_scale) / (1.0 + math.exp(bmm1_scale))
    assert out.item() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("bmm2_scale", [3.0, 0.25, -1.5])
def test_bmm2_scale_multiplies_the_output(bmm2_scale: float) -> None:
    k = torch.tensor([[[0.0]], [[1.0]]], dtype=F64)
    v = torch.tensor([[[2.0]], [[6.0]]], dtype=F64)
    out = run([k], [v], torch.ones(1, 1, 1, dtype=F64), 1, page_size=1, bmm2_scale=bmm2_scale)
    w = math.exp(1.0) / (1.0 + math.exp(1.0))
    assert out.item() == pytest.approx(bmm2_scale * ((1 - w) * 2.0 + w * 6.0), rel=1e-14)


def test_fp8_e4m3_dequantisation_through_the_scales() -> None:
    gen = torch.Generator().manual_seed(3)
    n, q_len, heads, dim = 6, 3, 2, 4
    k_scale, v_scale, sm_scale = 0.25, 0.5, dim**-0.5
    # Halves in [-4, 4] and integers in [-8, 8] are exact in e4m3, so nothing is lost storing them.
    k_stored = torch.randint(-8, 9, (n, heads, dim), generator=gen).to(F64) / 2
    v_stored = torch.randint(-8, 9, (n, heads, dim), generator=gen).to(F64)
    assert torch.equal(k_stored.to(torch.float8_e4m3fn).to(F64), k_stored)
    q = torch.randn(q_len, heads, dim, generator=gen, dtype=F64)
    p = paginate([k_stored], [v_stored], 4, dtype=torch.float8_e4m3fn)
    assert p.k_pages.dtype == torch.float8_e4m3fn
    out = paged_attention_reference(
        q,
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        q_len,
        bmm1_scale=sm_scale * k_scale,
        bmm2_scale=v_scale,
    )
    expected = expected_causal(q, k_stored * k_scale, v_stored * v_scale, q_len, sm_scale, 1.0)
    assert out.dtype == F64
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-12)


def tree_mask(parents: list[int]) -> torch.Tensor:
    """Row ``i`` sees itself and its ancestors; ``parents[i] = -1`` for a root."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        m = i
        while m >= 0:
            mask[i, m] = True
            m = parents[m]
    return mask


def test_tree_draft_mask_row_sees_prefix_and_ancestors_only() -> None:
    prefix, parents = 2, [-1, 0, 0, 1]  # rows 1 and 2 are siblings, 3 is 1's child
    q_len = len(parents)
    n = prefix + q_len
    ks, vs, _ = coded_requests([n])
    q = torch.zeros(q_len, 1, n, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=4, draft_mask=tree_mask(parents))
    ancestors = [[0], [0, 1], [0, 2], [0, 1, 3]]
    for i in range(q_len):
        seen = list(range(prefix)) + [prefix + m for m in ancestors[i]]
        assert_rows(out[i, 0], uniform_row(n, seen))


def test_per_request_tree_masks() -> None:
    prefixes, q_len = [1, 3], 3
    lengths = [p + q_len for p in prefixes]
    ks, vs, offsets = coded_requests(lengths)
    dim = sum(lengths)
    masks = torch.stack([tree_mask([-1, 0, 0]), tree_mask([-1, 0, 1])])
    q = torch.zeros(2 * q_len, 1, dim, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=2, draft_mask=masks)
    for b in range(2):
        for i in range(q_len):
            drafts = [m for m in range(q_len) if masks[b, i, m]]
            seen = [offsets[b] + j for j in range(prefixes[b])]
            seen += [offsets[b] + prefixes[b] + m for m in drafts]
            assert_rows(out[b * q_len + i, 0], uniform_row(dim, seen))


def test_draft_mask_is_still_causal() -> None:
    # An all-True mask must not reveal future draft tokens: the result is plain causal.
    ks, vs, _ = coded_requests([5])
    q = torch.zeros(3, 1, 5, dtype=F64)
    full = torch.ones(3, 3, dtype=torch.bool)
    assert torch.equal(run(ks, vs, q, 3, 2, draft_mask=full), run(ks, vs, q, 3, 2))


def test_a_row_with_no_visible_key_outputs_zero() -> None:
    # Prefix 0 and a mask row without its diagonal: nothing visible (cannot happen in SGLang).
    ks, vs, _ = coded_requests([2])
    q = torch.zeros(2, 1, 2, dtype=F64)
    mask = torch.tensor([[False, False], [True, True]])
    for sinks in (None, torch.tensor([0.5])):
        out = run(ks, vs, q, 2, 2, draft_mask=mask, sinks=sinks)
        assert out[0].tolist() == [[0.0, 0.0]]
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("stale", [1e3, float("nan"), float("inf")])
def test_last_partial_page_and_stale_slots(stale: float) -> None:
    # T = 7 on pages of 4: the last page has one stale slot; extra pages are all stale.
    prefix, q_len = 4, 3
    n = prefix + q_len
    ks, vs, _ = coded_requests([n])
    q = torch.zeros(q_len, 1, n, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=4, stale=stale)
    expected = torch.stack([uniform_row(n, list(range(prefix + i + 1))) for i in range(q_len)])
    assert_rows(out[:, 0], expected)


def test_block_table_garbage_past_used_columns_is_never_read() -> None:
    prefixes, q_len = [1, 6], 2
    lengths = [p + q_len for p in prefixes]
    ks, vs, offsets = coded_requests(lengths)
    dim = sum(lengths)
    q = torch.zeros(2 * q_len, 1, dim, dtype=F64)
    out = run(ks, vs, q, q_len, page_size=2, extra_columns=40)  # huge and negative ids
    for b in range(2):
        for i in range(q_len):
            seen = [offsets[b] + j for j in range(prefixes[b] + i + 1)]
            assert_rows(out[b * q_len + i, 0], uniform_row(dim, seen))


def test_dtypes_shapes_and_a_permuted_view() -> None:
    ks, vs, _ = coded_requests([4], h_kv=2)
    q = torch.zeros(2, 4, 4, dtype=torch.bfloat16)
    p = paginate(ks, vs, 2, nhd_view=True, dtype=torch.float16)
    assert not p.k_pages.is_contiguous()
    out = paged_attention_reference(
        q,
        p.k_pages,
        p.v_pages,
        p.block_tables.long(),
        p.seq_lens.long(),
        2,
        bmm1_scale=1.0,
        bmm2_scale=1.0,
        compute_dtype=torch.float32,
    )
    assert out.shape == (2, 4, 4) and out.dtype == torch.float32
    assert out[1, 3].tolist() == [0.25, 0.25, 0.25, 0.25]


def test_empty_batch_and_bad_arguments() -> None:
    ks, vs, _ = coded_requests([3])
    p = paginate(ks, vs, 2)
    scales = {"bmm1_scale": 1.0, "bmm2_scale": 1.0}
    empty = paged_attention_reference(
        torch.zeros(0, 1, 3), p.k_pages, p.v_pages, p.block_tables[:0], p.seq_lens[:0], 2, **scales
    )
    assert empty.shape == (0, 1, 3)
    q = torch.zeros(2, 1, 3, dtype=F64)
    with pytest.raises(ValueError, match="shapes"):  # 2 rows is not bs * L = 3
        paged_attention_reference(q, p.k_pages, p.v_pages, p.block_tables, p.seq_lens, 3, **scales)
    with pytest.raises(ValueError, match="seq_lens"):  # T_b < L
        paged_attention_reference(
            torch.zeros(4, 1, 3), p.k_pages, p.v_pages, p.block_tables, p.seq_lens, 4, **scales
        )
    with pytest.raises(ValueError, match="seq_lens"):  # table too narrow for T_b
        paged_attention_reference(
            q, p.k_pages, p.v_pages, p.block_tables[:, :1], p.seq_lens, 2, **scales
        )
