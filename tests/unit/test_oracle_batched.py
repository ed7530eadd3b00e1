"""The batched oracle is pinned to the readable one.

:func:`difftest.oracle.batched.batched_paged_attention` computes a whole launch in one padded
pass; :func:`difftest.oracle.attention.paged_attention_reference` is the definition. Over many
generated cases (every mask, window, sink, tree draft, GQA ratio, scale and storage the
generators reach) the float64 outputs agree within float64 rounding, and the float32 outputs
the noise floor is measured with agree within float32 rounding. Ragged launches (a query
length per request) agree with the definition run on each request alone.
"""

from __future__ import annotations

import _floors
import pytest
import torch
from _paged import ragged_launch

from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, Limits, cases
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.oracle.attention import paged_attention_reference
from difftest.oracle.batched import Rounding, _upcast, batched_paged_attention

SMALL = Limits(max_work=400_000, typical_requests=6, typical_prefix=200, long_share=5)


def _drawn() -> list[Case]:
    generic = sample_cases(cases(limits=SMALL), seed=16, count=120)
    presets = [
        c
        for name in ("gpt-oss-120b", "llama-3.1-8b", "qwen3.5-397b-a17b")
        for c in sample_cases(cases(preset=name, limits=SMALL), seed=17, count=20)
    ]
    return generic + presets


CASES = _drawn()


def _both(
    batch: Batch, compute: torch.dtype, p_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    _, kwargs = _floors.launch(batch)
    slow = paged_attention_reference(
        batch.q,
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.q_len,
        compute_dtype=compute,
        p_dtype=p_dtype,
        **kwargs,
    )
    (fast,) = batched_paged_attention(
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.q_len,
        [Rounding(batch.q, compute, p_dtype)],
        **kwargs,
    )
    return slow, fast


def test_the_generated_cases_reach_every_feature() -> None:
    def has(pred: object) -> bool:
        return any(pred(c) for c in CASES)  # type: ignore[operator]

    assert has(lambda c: c.attention.window_left >= 0)
    assert has(lambda c: c.attention.sinks)
    assert has(lambda c: c.batch.draft.kind == "tree")
    assert has(lambda c: c.attention.group_size > 1)
    assert has(lambda c: c.attention.kv_dtype == "fp8_e4m3")
    assert has(lambda c: c.attention.bmm2_scale != 1.0)
    assert has(lambda c: c.batch.padding_requests > 0)
    assert has(lambda c: c.pool.kv_storage == "kv_split_nhd")
    assert len(CASES) >= 150


def test_float64_agrees_with_the_definition_within_rounding() -> None:
    worst = 0.0
    for case in CASES:
        batch = materialize(case)
        slow, fast = _both(batch, torch.float64, None)
        scale = float(slow.abs().max()) if slow.numel() else 1.0
        err = float((slow - fast).abs().max()) if slow.numel() else 0.0
        # float64 rounding of sums over at most a few thousand keys, relative to the output
        assert err <= 1e-12 * max(scale, 1e-300), (case.digest(), err, scale)
        worst = max(worst, err / max(scale, 1e-300))
    assert worst < 1e-12


@pytest.mark.parametrize("p_dtype", [None, torch.bfloat16, torch.float16])
def test_float32_gives_the_same_noise_floor_as_the_definition(p_dtype: torch.dtype | None) -> None:
    # The noise floor runs the oracle in float32 and rounds it to the output dtype. Sums taken
    # in another order differ by float32 rounding, so an element may round to the neighbouring
    # output value: the floor, a request's largest distance from the float64 oracle, may move
    # by a few percent (an element near half an output ulp rounding the other way), or by one
    # output ulp in a request of few elements; far less than the tolerance's factor 2 on it.
    for case in CASES:
        batch = materialize(case)
        ref, _ = _both(batch, torch.float64, None)
        slow, fast = _both(batch, torch.float32, p_dtype)
        if not ref.numel():
            continue
        bs = batch.batch_size

        mine, theirs = (
            (low.to(batch.out_dtype).double() - ref).abs().reshape(bs, -1).amax(dim=1)
            for low in (fast, slow)
        )
        peak = ref.abs().reshape(bs, -1).amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
        ulp = torch.finfo(batch.out_dtype).eps * torch.exp2(torch.floor(torch.log2(peak)))
        moved = (mine - theirs).abs()
        ok = (moved <= 0.05 * theirs) | (moved <= ulp)
        assert bool(ok.all()), (case.digest(), mine, theirs)


def test_one_gather_serves_several_roundings() -> None:
    case = next(c for c in CASES if c.attention.group_size > 1 and c.attention.sinks)
    b = materialize(case)
    args = (b.k_pages, b.v_pages, b.block_tables, b.seq_lens, b.q_len)
    kwargs = {
        "bmm1_scale": b.bmm1_scale,
        "bmm2_scale": b.bmm2_scale,
        "window_left": b.window_left,
        "sinks": b.sinks,
        "draft_mask": None if b.is_chain_draft else b.draft_mask,
    }
    roundings = [
        Rounding(b.q),
        Rounding(b.q, torch.float32, torch.bfloat16),
        Rounding(b.q, torch.float32),
    ]
    together = batched_paged_attention(*args, roundings, **kwargs)
    for rounding, out in zip(roundings, together, strict=True):
        (alone,) = batched_paged_attention(*args, [rounding], **kwargs)
        assert out.dtype == rounding.compute_dtype
        assert torch.equal(out, alone)


@pytest.mark.parametrize("seed", range(40))
def test_a_ragged_launch_is_each_request_alone(seed: int) -> None:
    """Requests with their own query lengths in one pool: each request's rows equal the
    definition run on that request alone (one request, its own ``L``)."""
    launch = ragged_launch(seed)
    p = launch.paged
    (fast,) = batched_paged_attention(
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        launch.q_lens,
        [Rounding(launch.q)],
        draft_mask=launch.draft,
        **launch.kwargs,
    )
    start = 0
    for b, n in enumerate(launch.q_lens):
        mine = fast[start : start + n]
        assert torch.allclose(mine, launch.alone(b), rtol=1e-12, atol=1e-12), (b, n)
        start += n


def test_bad_shapes_are_refused() -> None:
    case = CASES[0]
    b = materialize(case)
    with pytest.raises(ValueError, match="shapes disagree"):
        batched_paged_attention(
            b.k_pages,
            b.v_pages,
            b.block_tables,
            b.seq_lens,
            b.q_len + 1,
            [Rounding(b.q)],
            bmm1_scale=1.0,
            bmm2_scale=1.0,
        )
    assert (
        batched_paged_attention(
            b.k_pages,
            b.v_pages,
            b.block_tables,
            b.seq_lens,
            b.q_len,
            [],
            bmm1_scale=1.0,
            bmm2_scale=1.0,
        )
        == []
    )


def test_cpu_limits_cases_fit_one_chunk() -> None:
    # A CPU case is one padded computation (no loop over chunks of requests).
    from difftest.oracle.batched import CHUNK_ELEMENTS

    def largest(c: Case) -> int:  # its padded scores or its gathered K, whichever is larger
        a = c.attention
        per_token = max(a.num_qo_heads * c.batch.q_len, a.num_kv_heads * a.head_dim)
        return max(c.batch.seq_lens()) * per_token * c.batch.num_requests

    worst = max(largest(c) for c in sample_cases(cases(limits=CPU_LIMITS), seed=3, count=60))
    assert worst <= CHUNK_ELEMENTS


def test_a_chunk_bounds_its_gathered_kv_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """With few query rows per KV head (``L * group < D``, as in most verify batches) the
    gathered K and V of a chunk are larger than its scores: the chunking bounds them too (an
    H200 worker once asked for 8 GiB of float64 K in one chunk), and the output is the
    one-chunk output, to within float64 rounding."""
    import difftest.oracle.batched as batched

    case = next(
        c
        for c in CASES
        if c.batch.num_requests >= 4
        and not c.batch.is_ragged
        and c.batch.q_len * c.attention.group_size < c.attention.head_dim
    )
    b = materialize(case)
    _, whole = _both(b, torch.float64, None)
    a = case.attention
    per_key = a.num_kv_heads * a.head_dim  # a key's K elements: more than its scores here
    assert per_key > a.num_qo_heads * case.batch.q_len
    longest = max(case.batch.seq_lens())
    seen: list[tuple[int, int]] = []
    real = batched._chunk

    def spy(k_tok: torch.Tensor, v_tok: torch.Tensor, table: torch.Tensor, *rest, **kw):  # type: ignore[no-untyped-def]
        seen.append((table.shape[0], rest[2]))  # the chunk's requests, keys per request
        return real(k_tok, v_tok, table, *rest, **kw)

    monkeypatch.setattr(batched, "CHUNK_ELEMENTS", 2 * longest * per_key)
    monkeypatch.setattr(batched, "_chunk", spy)
    _, chunked = _both(b, torch.float64, None)
    assert len(seen) >= 2 and sum(n_b for n_b, _ in seen) == case.batch.num_requests
    assert all(n_b * n * per_key <= batched.CHUNK_ELEMENTS for n_b, n in seen)
    scale = float(whole.abs().max())
    assert float((chunked - whole).abs().max()) <= 1e-12 * max(scale, 1e-300)


def test_many_chunks_agree_with_the_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every generated case cut into chunks of requests by span (a bound no two requests
    share, past which each request is its own chunk): float64 agrees with the definition
    within rounding, ragged and windowed cases too."""
    import difftest.oracle.batched as batched

    monkeypatch.setattr(batched, "CHUNK_ELEMENTS", 1)
    for case in CASES[:80]:
        batch = materialize(case)
        slow, fast = _both(batch, torch.float64, None)
        scale = float(slow.abs().max()) if slow.numel() else 1.0
        err = float((slow - fast).abs().max()) if slow.numel() else 0.0
        assert err <= 1e-12 * max(scale, 1e-300), (case.digest(), err, scale)


def test_a_chunk_holds_requests_of_like_length() -> None:
    """Past one chunk, requests are chunked by span (shortest first), each chunk within the
    bound and padded to its own longest: every request once, and far less padding than
    chunks of requests in their order; what fits is one chunk in order, as before."""
    from difftest.oracle.batched import CHUNK_ELEMENTS, _chunk_plan

    assert _chunk_plan([5, 1, 3], per_key=1) == [None]
    spans = [4000 if i % 10 == 0 else 40 + i % 7 for i in range(400)]  # a few long requests
    per_key = CHUNK_ELEMENTS // (16 * 4000)  # 16 of the longest fit a chunk
    plan = _chunk_plan(spans, per_key)
    chunks = [c for c in plan if c is not None]
    assert len(chunks) == len(plan) >= 2
    assert sorted(i for c in chunks for i in c) == list(range(400))
    assert all(len(c) * max(spans[i] for i in c) * per_key <= CHUNK_ELEMENTS for c in chunks)
    padded = sum(len(c) * max(spans[i] for i in c) for c in chunks)
    step = CHUNK_ELEMENTS // (4000 * per_key)  # contiguous chunks pad to their longest
    in_order = sum(len(spans[j : j + step]) * max(spans[j : j + step]) for j in range(0, 400, step))
    assert padded * 5 < in_order
    assert padded <= 1.2 * sum(spans)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_a_narrow_cache_reaches_float64_through_float32_unchanged(dtype: torch.dtype) -> None:
    """The oracle upcasts 8- and 16-bit K/V to float64 through float32 (every value of theirs
    is exact there): each of the dtype's bit patterns gives the float64 a direct conversion
    gives, and the float32 copy it leaves is the direct float32 conversion."""
    bits = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int32)
    raw = bits.to(torch.int16 if dtype.itemsize == 2 else torch.uint8).view(dtype)
    raw = raw.view(1, 1, 1, -1)  # an operand [b, H_kv, m, n]
    done: dict[torch.dtype, torch.Tensor] = {}
    wide = _upcast(raw, torch.float64, done)
    direct = raw.to(torch.float64)
    assert torch.equal(wide.isnan(), direct.isnan())
    assert torch.equal(wide.nan_to_num(0.0), direct.nan_to_num(0.0))
    assert torch.equal(done[torch.float32].nan_to_num(0.0), raw.float().nan_to_num(0.0))
    assert _upcast(raw, torch.float32, done) is done[torch.float32]  # converted once
    wide32 = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    assert torch.equal(_upcast(wide32, torch.float32, {}), wide32.float())  # rounded once


def test_an_operand_is_converted_in_the_layout_matmul_reads() -> None:
    """A gathered K^T or V is token-major, so its batch dims do not flatten: it is converted
    straight into the contiguous tensor ``torch.matmul`` would copy it to, and a product's
    bits are those of the stride-keeping conversion. One that flattens keeps its strides."""
    torch.manual_seed(0)
    tokens = torch.randn(3, 40, 2, 16).to(torch.bfloat16)  # [b, t, H_kv, D], as gathered
    q = torch.randn(3, 2, 5, 16, dtype=torch.float64)
    for raw in (tokens.permute(0, 2, 1, 3), tokens.permute(0, 2, 3, 1)):  # V, K^T
        for dtype in (torch.float32, torch.float64):
            operand = _upcast(raw, dtype, {})
            assert operand.is_contiguous() and torch.equal(operand, raw.to(dtype))
    k_t = tokens.permute(0, 2, 3, 1)
    before = torch.matmul(q, k_t.double())
    assert torch.equal(torch.matmul(q, _upcast(k_t, torch.float64, {})), before)
    one = tokens[:1].permute(0, 2, 1, 3)  # one request: its batch dims flatten
    assert _upcast(one, torch.float32, {}).stride() == one.float().stride()
