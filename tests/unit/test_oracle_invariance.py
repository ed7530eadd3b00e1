"""Arguments that must not matter: physical page order, request order, stale data, garbage ids.

Each test runs the oracle twice on the same logical batch laid out differently and requires
bitwise-equal outputs (1e-12 where the batch itself is regrouped), plus the precision knob
``p_dtype`` that the tolerance code relies on.
"""

from __future__ import annotations

import pytest
import torch
from _paged import Case, oracle, paginate, random_case

from difftest.oracle.attention import paged_attention_reference


def num_pages(case: Case, extra: int = 2) -> int:
    return sum(-(-k.shape[0] // case.page_size) for k in case.ks) + extra


@pytest.mark.parametrize("seed", range(12))
def test_physical_page_order_does_not_matter(seed: int) -> None:
    case = random_case(seed)
    n = num_pages(case)
    identity = oracle(case, page_order=list(range(n)))
    for perm_seed in range(3):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed)).tolist()
        assert torch.equal(oracle(case, page_order=order), identity)
    assert torch.equal(oracle(case, page_order=list(reversed(range(n)))), identity)


@pytest.mark.parametrize("seed", range(12))
def test_request_order_permutes_the_output_rows(seed: int) -> None:
    case = random_case(seed)
    bs, q_len = len(case.ks), case.q_len
    out = oracle(case)
    perm = list(reversed(range(bs))) if seed % 2 else [*range(1, bs), 0]
    rows = [b * q_len + i for b in perm for i in range(q_len)]
    mask = case.draft_mask
    permuted = Case(
        [case.ks[b] for b in perm],
        [case.vs[b] for b in perm],
        case.q[rows],
        q_len,
        case.page_size,
        case.window_left,
        case.sinks,
        mask[perm] if mask is not None and mask.dim() == 3 else mask,
        case.bmm1_scale,
        case.bmm2_scale,
    )
    torch.testing.assert_close(oracle(permuted), out[rows], rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(12))
def test_stale_slots_and_garbage_columns_do_not_matter(seed: int) -> None:
    case = random_case(seed)
    base = oracle(case, stale=0.0, extra_columns=0)
    assert torch.equal(oracle(case, stale=1e6, stale_seed=seed + 7), base)
    assert torch.equal(oracle(case, stale=float("nan")), base)
    assert torch.equal(oracle(case, stale=float("-inf"), extra_pages=9), base)
    for garbage_seed in range(3):
        garbled = oracle(case, extra_columns=17, garbage_seed=garbage_seed)
        assert torch.equal(garbled, base)


@pytest.mark.parametrize("seed", range(6))
def test_layout_strides_and_index_dtypes_do_not_matter(seed: int) -> None:
    case = random_case(seed)
    p = paginate(case.ks, case.vs, case.page_size, nhd_view=True)
    kw = {
        "bmm1_scale": case.bmm1_scale,
        "bmm2_scale": case.bmm2_scale,
        "window_left": case.window_left,
        "sinks": case.sinks,
        "draft_mask": case.draft_mask,
    }
    view = paged_attention_reference(
        case.q,
        p.k_pages,
        p.v_pages,
        p.block_tables,
        p.seq_lens,
        case.q_len,
        **kw,
    )
    dense = paged_attention_reference(
        case.q,
        p.k_pages.contiguous(),
        p.v_pages.contiguous(),
        p.block_tables.long(),
        p.seq_lens.long(),
        case.q_len,
        **kw,
    )
    if p.k_pages.shape[1] > 1 and p.k_pages.shape[2] > 1:  # else the view is still contiguous
        assert not p.k_pages.is_contiguous()
    assert torch.equal(view, dense)


@pytest.mark.parametrize("seed", range(6))
def test_chunking_over_requests_does_not_matter(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Force one request per chunk (each chunk then pads to its own max length).
    case = random_case(seed)
    whole = oracle(case)
    monkeypatch.setattr("difftest.oracle.attention._CHUNK_ELEMENTS", 1)
    torch.testing.assert_close(oracle(case), whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_p_dtype_emulates_kernel_precision(seed: int) -> None:
    case = random_case(seed + 1000)
    p = paginate(case.ks, case.vs, case.page_size)
    args = (case.q, p.k_pages, p.v_pages, p.block_tables, p.seq_lens, case.q_len)
    kw = {
        "bmm1_scale": case.bmm1_scale,
        "bmm2_scale": case.bmm2_scale,
        "window_left": case.window_left,
        "sinks": case.sinks,
        "draft_mask": case.draft_mask,
    }
    exact = paged_attention_reference(*args, **kw)
    rough = paged_attention_reference(
        *args,
        **kw,
        compute_dtype=torch.float32,
        p_dtype=torch.bfloat16,
    )
    assert rough.dtype == torch.float32
    err = (rough.double() - exact).abs().max() / exact.abs().max()
    assert 0 < err < 1e-2
