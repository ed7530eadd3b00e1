"""The oracle against an independent formulation: a scalar Python loop over contiguous KV.

The loop below restates docs/semantics.md §2 one key at a time (no tensors, no masks, no paging)
and is run on random small batches; the oracle, fed the same tokens scattered over shuffled
pages full of stale data, must agree to 1e-12.
"""

from __future__ import annotations

import math

import pytest
import torch
from _paged import Case, oracle, random_case


def scalar_attention(case: Case) -> list[list[list[float]]]:
    """``out[row][h][c]`` by explicit loops over requests, rows, heads, keys and channels."""
    h_q = case.q.shape[1]
    rows: list[list[list[float]]] = []
    q_all = case.q.tolist()
    for b, (k_b, v_b) in enumerate(zip(case.ks, case.vs, strict=True)):
        n, h_kv, dim = k_b.shape
        keys, values = k_b.tolist(), v_b.tolist()
        first_new = n - case.q_len  # the draft block starts after the prefix
        for i in range(case.q_len):
            pos = first_new + i
            row: list[list[float]] = []
            for h in range(h_q):
                kv = h * h_kv // h_q  # consecutive query heads share one KV head
                q = q_all[b * case.q_len + i][h]
                logits, seen = [], []
                for j in range(n):
                    if j > pos:
                        continue  # the future
                    if case.window_left >= 0 and pos - j > case.window_left:
                        continue  # left of the window
                    if j >= first_new and case.draft_mask is not None:
                        mask = case.draft_mask if case.draft_mask.dim() == 2 else case.draft_mask[b]
                        if not bool(mask[i, j - first_new]):
                            continue  # a draft token that is not an ancestor
                    dot = math.fsum(q[c] * keys[j][kv][c] for c in range(dim))
                    logits.append(case.bmm1_scale * dot)
                    seen.append(j)
                sink = None if case.sinks is None else float(case.sinks[h])
                if not logits:
                    row.append([0.0] * dim)
                    continue
                top = max([*logits, sink]) if sink is not None else max(logits)
                weights = [math.exp(x - top) for x in logits]
                denom = math.fsum(weights) + (0.0 if sink is None else math.exp(sink - top))
                out = []
                for c in range(dim):
                    num = math.fsum(
                        w * values[j][kv][c] for w, j in zip(weights, seen, strict=True)
                    )
                    out.append(case.bmm2_scale * num / denom)
                row.append(out)
            rows.append(row)
    return rows


@pytest.mark.parametrize("seed", range(60))
def test_oracle_matches_scalar_loop(seed: int) -> None:
    case = random_case(seed)
    expected = torch.tensor(scalar_attention(case), dtype=torch.float64)
    out = oracle(case, nhd_view=bool(seed % 2), stale_seed=seed)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("seed", range(100, 110))
def test_oracle_matches_scalar_loop_low_precision_kv(kv_dtype: torch.dtype, seed: int) -> None:
    case = random_case(seed, kv_dtype)
    expected = torch.tensor(scalar_attention(case), dtype=torch.float64)
    torch.testing.assert_close(oracle(case, kv_dtype), expected, rtol=1e-12, atol=1e-12)


def test_random_cases_cover_every_feature() -> None:
    # Guards the generator above: the 60 seeds must reach each mode this file claims to test.
    cases = [random_case(seed) for seed in range(60)]
    assert {len(c.ks) for c in cases} == {1, 2, 3}
    assert {c.q_len for c in cases} == {1, 2, 3, 4, 5}
    assert {c.q.shape[1] // c.ks[0].shape[1] for c in cases} == {1, 2, 4}
    assert any(c.window_left >= 0 for c in cases) and any(c.window_left < 0 for c in cases)
    assert any(c.sinks is not None for c in cases) and any(c.sinks is None for c in cases)
    assert any(c.draft_mask is not None and c.draft_mask.dim() == 3 for c in cases)
    chain = [torch.ones_like(c.draft_mask).tril() for c in cases if c.draft_mask is not None]
    trees = [c.draft_mask for c in cases if c.draft_mask is not None]
    assert any(not torch.equal(t, ch) for t, ch in zip(trees, chain, strict=True))  # branching
    assert any(c.ks[0].shape[0] % c.page_size for c in cases)  # a last partial page
