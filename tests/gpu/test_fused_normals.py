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


@pytest.mark.parametrize("n", [1, 2, 7, 64, 128, 256, 1000])
@pytest.mark.parametrize("rows", [1, 3, 1023, 70_001])
def test_fused_normals_have_the_torch_bits(rows: int, n: int) -> None:
    prefix = rng.mix(torch.arange(rows, dtype=torch.int64, device="cuda"))  # every bit pattern
    mine = fused_normals.fused(prefix, n)
    theirs = rng._torch_normals(prefix, n)
    assert mine.shape == theirs.shape == (rows, n)
    assert torch.equal(mine.view(torch.int64), theirs.view(torch.int64))


def test_the_first_use_check_passes_here() -> None:
    assert fused_normals.agrees(torch.device("cuda"), rng._torch_normals)


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
