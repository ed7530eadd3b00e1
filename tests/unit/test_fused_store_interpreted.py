"""The fused Triton store is pinned to the torch form on a CPU, under Triton's interpreter.

:mod:`difftest.generation.fused_store` writes a role's values (K, V, stale slots, queries) in
one kernel on a GPU, tile by tile (tokens x dims of one head). Here the same kernel runs under
Triton's interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` where no CUDA GPU is
visible; skipped, with the reason, where Triton is not installed) and must write the torch
form's bytes: the hash, the tile's coordinates, every step of a recipe and the strided slot
writes. The interpreter converts float32 to bfloat16 and to fp8 by truncation, not by rounding
to nearest even as a GPU and torch do, so the stored bytes are compared in float32 and float16;
``tests/gpu/test_fused_store.py`` compares whole cases in every dtype on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from _interpreter import not_interpretable

from difftest.generation import fused_normals, fused_store
from difftest.generation import materialize as m
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import Limits, cases
from difftest.generation.values import Recipe

WHY_NOT = not_interpretable("the fused store's kernel")
interpreted = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

EXACT = (torch.float32, torch.float16)
"""The stored dtypes whose conversion the interpreter rounds as a GPU does."""


@pytest.fixture(name="interpreter")
def interpreter_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The kernel built anew for this test under the interpreter, and dropped after it."""
    assert fused_normals._have_triton()
    monkeypatch.setattr(fused_store, "_kernel", None)
    monkeypatch.setattr(fused_store, "_checked", None)
    yield


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


# (heads, dim, page size, tokens): many tokens a tile; many heads (a program each) and
# fewer tokens than a tile; dims that are not powers of two; one-token pages
SHAPES = [(3, 67, 16, 300), (1, 16, 1, 100), (64, 128, 64, 5), (8, 80, 32, 77), (2, 256, 8, 33)]


@interpreted
@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize(("heads", "dim", "page_size", "tokens"), SHAPES)
def test_every_recipe_step_stores_the_torch_forms_bytes(
    heads: int, dim: int, page_size: int, tokens: int
) -> None:
    req = torch.arange(tokens, dtype=torch.int64) % 5 - 1
    tok = torch.arange(tokens, dtype=torch.int64) * 7
    slots = torch.arange(tokens, dtype=torch.int64) * 97 % (tokens + 40)  # distinct, shuffled
    pages = -(-(tokens + 40) // page_size)
    factor = torch.where(tok % 3 == 0, 16.0, 1.0).to(torch.float64)
    base = torch.linspace(-2.0, 2.0, heads * dim, dtype=torch.float64).view(heads, dim)
    sample = [
        (
            Recipe(key=-(1 << 62) + 17, factor=factor, times=3.0, scale=0.7, then=3.0),
            (req, tok),
            0.3,
            448.0,
        ),
        (Recipe(key=12345, over=10.0, base=base, scale=2.5), (req, tok), 0.25, 6.0),
        (Recipe(key=7, times=256.0), (slots,), 1.0, 448.0),
        (Recipe(key=0, scale=0.3, coded=True), (req, tok), 3.0, None),
        (Recipe(key=99, over=3.0), (tok,), 7.0, None),
    ]
    for recipe, columns, divisor, limit in sample:
        for dtype in EXACT:
            pool = torch.zeros((pages, heads, page_size, dim), dtype=dtype)  # head-major
            mine, theirs = pool.clone(), pool.clone()
            args = (slots, page_size, columns, recipe, heads, dim, divisor, limit)
            fused_store.fused(mine.transpose(1, 2), *args)
            m._store_torch(theirs.transpose(1, 2), *args)
            assert int((mine != 0).sum()) > tokens * heads * dim // 2  # it wrote the slots
            assert torch.equal(_raw(mine), _raw(theirs)), (recipe.key, dtype)


def test_the_tile_covers_a_row_within_the_block() -> None:
    for dim in (16, 32, 64, 80, 96, 128, 256, 1024, 2048):
        tb, nb = fused_store.tile(dim)
        assert nb >= dim and nb & (nb - 1) == 0 and nb < 2 * dim
        assert tb & (tb - 1) == 0 and tb >= 1
        # a full block of elements, or one token of a row wider than the block
        assert tb * nb == max(fused_store.BLOCK, nb)


@interpreted
@pytest.mark.usefixtures("interpreter")
def test_whole_cases_materialise_the_same_bytes_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn cases in float16 (K/V and queries), stale slots, padding rows and value families
    included, materialised with the kernel and with the torch form."""
    drawn = sample_cases(
        cases(limits=Limits(max_work=100_000, typical_prefix=96)), seed=41, count=24
    )
    half = [
        c.replace(attention=dataclasses.replace(c.attention, kv_dtype="fp16", q_dtype="fp16"))
        for c in drawn
    ]
    assert any(c.batch.padding_rows for c in half)
    assert len({c.values.family for c in half}) > 2
    assert len({c.pool.stale_fill for c in half}) > 1
    kernel = mock.Mock(wraps=fused_store.fused)
    monkeypatch.setattr(fused_store, "fused", kernel)
    for case in half:
        monkeypatch.setattr(fused_store, "usable", lambda device: False)
        plain = m.materialize(case, "cpu")
        monkeypatch.setattr(fused_store, "usable", lambda device: True)
        monkeypatch.setattr(fused_store, "_checked", True)  # no first-use check: this is it
        fused = m.materialize(case, "cpu")
        for name, value in vars(plain).items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(_raw(getattr(fused, name)), _raw(value)), (name, case)
    assert kernel.call_count >= 3 * len(half)  # it did store: K, V and queries of each case


def test_what_varies_from_case_to_case_builds_no_new_kernel() -> None:
    """Triton compiles a kernel per set of constexprs and per specialisation of the other
    integers and pointers (benchmarks/count_store_kernels.py): every argument that differs
    between calls of one head dim and dtype (the token count, the recipe's steps, one or two
    token columns, a coded recipe, an index array's alignment) must be one the kernel does not
    specialise on, or each case would build its own kernel (Run 30)."""

    def specialised(tokens: int, recipe: Recipe, two: bool, offset: int) -> dict[str, object]:
        idx = torch.arange(tokens + offset, dtype=torch.int64)[offset:]
        pool = torch.zeros((8, 16, 4, 128), dtype=torch.bfloat16)
        columns = (idx % 3, idx) if two else (idx,)
        launch = fused_store.launch_arguments(pool, idx, 16, columns, recipe, 4, 128, 0.5, 448.0)
        assert launch is not None
        _, args = launch
        out: dict[str, object] = {}
        for name, value in args.items():
            if isinstance(value, torch.Tensor):
                aligned = name in fused_store.COLUMN_ARGS or value.data_ptr() % 16 == 0
                out[name] = (value.dtype, aligned)
            elif name not in fused_store.NOT_SPECIALISED:
                out[name] = value
        return out

    first = specialised(100, Recipe(key=1), False, 0)
    factor = torch.ones(33, dtype=torch.float64)
    base = torch.zeros(4, 128, dtype=torch.float64)
    for other in (
        specialised(33, Recipe(key=2, factor=factor, times=3.0, over=7.0), True, 1),
        specialised(64, Recipe(key=3, base=base, scale=0.5), True, 0),
        specialised(1, Recipe(key=4, coded=True), False, 3),
    ):
        assert other == first
