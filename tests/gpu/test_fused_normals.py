"""The fused Triton normals give the torch form's bits on the GPU: over shapes, widths and
prefixes across the int64 range, and for whole cases (every tensor of the stored cases of
``tests/data/verdicts.json``, built with them and without, compared bit for bit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from difftest.generation import fused_normals, rng
from difftest.generation.materialize import materialize
from difftest.model.case import Case

STORED = Path(__file__).parents[1] / "data" / "verdicts.json"

pytestmark = pytest.mark.skipif(
    not fused_normals._have_triton(), reason="Triton is not installed: nothing fused to test"
)


SPREAD = 0x2545F4914F6CDD1D  # times an arange, wraps over the whole int64 range


@pytest.mark.parametrize("n", [1, 2, 7, 64, 128, 256, 1000])
@pytest.mark.parametrize("tokens", [1, 3, 1023, 70_001])
@pytest.mark.parametrize(("keys", "columns"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_fused_normals_have_the_torch_bits(tokens: int, n: int, keys: int, columns: int) -> None:
    ks = [rng.key(tokens + n, rng.Stream.K), rng.key(tokens, rng.Stream.V)][:keys]
    base = torch.arange(-1, tokens - 1, dtype=torch.int64, device="cuda")
    cols = [base, base * SPREAD + 7][:columns]
    heads = 3 if tokens * n < 10_000_000 else 1
    mine = fused_normals.fused(ks, cols, heads, n)
    theirs = rng._torch_token_normals(ks, cols, heads, n)
    assert mine.shape == theirs.shape == (keys, tokens, heads, n)
    assert torch.equal(mine.view(torch.int64), theirs.view(torch.int64))


def test_the_first_use_check_passes_here() -> None:
    assert fused_normals.agrees(torch.device("cuda"), rng._torch_token_normals)


def _bytes(case: Case, fused: bool) -> dict[str, torch.Tensor]:
    before = fused_normals.ENABLED
    fused_normals.ENABLED = fused
    try:
        batch = materialize(case, "cuda")
    finally:
        fused_normals.ENABLED = before
    return {
        name: value.contiguous().view(-1).view(torch.uint8)
        for name, value in vars(batch).items()
        if isinstance(value, torch.Tensor)
    }


def test_every_stored_case_is_built_with_the_same_bits() -> None:
    cases = [Case.from_json(e["case"]) for e in json.loads(STORED.read_text())["cases"]]
    differ = []
    for n, case in enumerate(cases):
        fused, plain = _bytes(case, True), _bytes(case, False)
        assert fused.keys() == plain.keys() and "kv_storage" in fused
        differ += [f"case {n} {k}" for k in fused if not torch.equal(fused[k], plain[k])]
    assert not differ, differ[:10]
