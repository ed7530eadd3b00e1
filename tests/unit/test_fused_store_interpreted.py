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
import functools
import threading
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from _interpreter import not_interpretable

from difftest.execution import packing
from difftest.generation import fused_normals, fused_store, placement
from difftest.generation import materialize as m
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import Limits, cases
from difftest.generation.values import Recipe
from difftest.model.case import Case

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


def _half(drawn: list[Case]) -> list[Case]:
    """``drawn`` with float16 K/V and queries (what the interpreter rounds as a GPU does)."""
    return [
        c.replace(attention=dataclasses.replace(c.attention, kv_dtype="fp16", q_dtype="fp16"))
        for c in drawn
    ]


@interpreted
@pytest.mark.usefixtures("interpreter")
def test_whole_cases_materialise_the_same_bytes_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drawn cases in float16 (K/V and queries), stale slots, padding rows and value families
    included, materialised with the kernel and with the torch form."""
    half = _half(
        sample_cases(cases(limits=Limits(max_work=100_000, typical_prefix=96)), seed=41, count=24)
    )
    assert any(c.batch.padding_rows for c in half)
    assert len({c.values.family for c in half}) > 2
    assert len({c.pool.stale_fill for c in half}) > 1
    kernel = mock.Mock(wraps=fused_store.launch)
    monkeypatch.setattr(fused_store, "launch", kernel)
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


@interpreted
@pytest.mark.usefixtures("interpreter")
@pytest.mark.parametrize(
    ("heads", "dim", "page_size"), [(3, 67, 16), (2, 128, 1), (4, 16, 8), (3, 67, 1)]
)
def test_the_segments_of_one_launch_store_what_each_stores_alone(
    heads: int, dim: int, page_size: int
) -> None:
    """Several calls in one launch (a packed launch's roles and cases, each into its own part
    of one pool): every recipe step, one and two columns, a coded recipe, token counts that
    end mid-tile and an empty segment, each segment where the torch form puts it."""
    pages = 97  # a part's slots, 97 x page size, are prime to 7: the slots below are distinct
    sizes = [37, 1, 0, 90, 8, 53]
    plans = [
        (Recipe(key=-(1 << 62) + 17, times=3.0, scale=0.7, then=3.0), 2, 0.3, 448.0, True),
        (Recipe(key=12345, over=10.0, scale=2.5), 2, 0.25, 6.0, False),
        (Recipe(key=5), 1, 1.0, None, False),
        (Recipe(key=0, scale=0.3, coded=True), 2, 3.0, None, False),
        (Recipe(key=99, over=3.0), 1, 7.0, None, True),
        (Recipe(key=7, times=256.0), 1, 1.0, 448.0, False),
    ]
    base = torch.linspace(-2.0, 2.0, heads * dim, dtype=torch.float64).view(heads, dim)
    for dtype in EXACT:
        pool = torch.zeros((len(sizes) * pages, heads, page_size, dim), dtype=dtype)
        together, theirs = pool.clone(), pool.clone()
        segments, expected = [], []
        for i, (tokens, (recipe, ncols, divisor, limit, with_factor)) in enumerate(
            zip(sizes, plans, strict=True)
        ):
            idx = torch.arange(tokens, dtype=torch.int64)
            slots = idx * 7 % (pages * page_size)  # distinct, out of order
            columns = (idx % 3 - 1, idx * 5 + i) if ncols == 2 else (idx + 11 * i,)
            if with_factor:
                recipe = dataclasses.replace(
                    recipe, factor=torch.where((idx + i) % 3 == 0, 16.0, 1.0).to(torch.float64)
                )
            if i in (1, 5):  # two bases: the second at an offset
                recipe = dataclasses.replace(recipe, base=base * i)
            rest = (slots, page_size, columns, recipe, heads, dim, divisor, limit)
            part = slice(i * pages, (i + 1) * pages)
            segments.append(fused_store.Segment(together[part].transpose(1, 2), *rest))
            expected.append((theirs[part].transpose(1, 2), *rest))
        launch = fused_store.launch_arguments(segments)
        assert launch is not None
        # parts of 97 pages start at multiples of 16 elements unless heads x page x dim is odd
        assert launch[1]["DEST_ALIGNED"] == ((heads * page_size * dim) % 16 == 0)
        fused_store.launch(segments)
        for call in expected:
            m._store_torch(*call)
        assert int((together != 0).sum()) > sum(sizes) * heads * dim // 2  # it wrote them
        assert torch.equal(_raw(together), _raw(theirs)), dtype


@interpreted
@pytest.mark.usefixtures("interpreter")
def test_a_packed_launch_stored_together_is_its_cases_stored_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A launch's cases materialised into its pool and query rows with their stores together
    (:func:`materialize.stores_together`): the bytes of each case materialised alone, in two
    launches of the kernel for the whole launch (its pool, its query rows)."""
    drawn = sample_cases(cases(limits=Limits(max_work=60_000, typical_prefix=64)), seed=7, count=80)
    groups = [g for g in packing.group_for_launches(_half(drawn), 6) if len(g) > 2][:3]
    assert groups and any(c.pool.stale_fill != "zeros" for g in groups for c in g)
    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(fused_store, "_checked", True)
    kernel = mock.Mock(wraps=fused_store.launch)
    monkeypatch.setattr(fused_store, "launch", kernel)
    cpu = torch.device("cpu")
    for group in groups:
        alone = [m.materialize(c, cpu) for c in group]
        kernel.reset_mock()
        storage, pools = packing.launch_pool(group, cpu)
        queries, rows = packing.launch_queries(group, cpu)
        plans = placement.on_device([placement.place(c) for c in group], cpu)
        with m.stores_together():
            together = [
                m.materialize(c, cpu, pool=p, queries=q, plan=plan)
                for c, p, q, plan in zip(group, pools, rows, plans, strict=True)
            ]
            assert kernel.call_count == 0  # nothing stored before the block ends
        assert kernel.call_count == 2
        for a, t in zip(alone, together, strict=True):
            assert torch.equal(_raw(a.kv_storage), _raw(t.kv_storage))
            assert torch.equal(_raw(a.q_padded), _raw(t.q_padded))
        launch = packing.pack(together, storage, queries)
        assert launch.batch.q_padded.data_ptr() == queries.data_ptr()  # no copy


_SMALL_POOL = (4, 2, 2, 8, 16)
"""[pages, K/V, heads, slot, dim]: a pool of two heads of 16 dims, pages of 8 slots."""


def _store_role(pool: torch.Tensor, role: int) -> None:
    """Five tokens of ``role`` (0: K, 1: V) of ``pool`` by :func:`fused_store.store`."""
    idx = torch.arange(5, dtype=torch.int64)
    dest = pool[:, role].transpose(1, 2)
    fused_store.store(dest, idx, 8, (idx,), Recipe(key=role), 2, 16, 1.0, None, m._store_torch)


def test_a_block_that_raises_stores_nothing_and_nested_blocks_store_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched: list[int] = []
    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(fused_store, "_checked", True)
    monkeypatch.setattr(fused_store, "launch", lambda segments: launched.append(len(segments)))
    pool = torch.zeros(_SMALL_POOL, dtype=torch.float32)
    store = functools.partial(_store_role, pool)

    with pytest.raises(RuntimeError), fused_store.deferred():
        store(0)
        raise RuntimeError("the launch failed")
    assert launched == []
    with fused_store.deferred():
        store(0)
        with fused_store.deferred():
            store(1)
        assert launched == []
    assert launched == [2]  # K and V of one pool: one launch


def test_each_thread_launches_only_the_stores_it_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches are evaluated on executor threads: a thread's block holds back its own stores
    only, and launches them itself (another thread's block ending must not launch them, nor
    take them away before they are launched)."""
    launched: dict[str, list[int]] = {"main": [], "other": []}
    monkeypatch.setattr(fused_store, "usable", lambda device: True)
    monkeypatch.setattr(fused_store, "_checked", True)
    monkeypatch.setattr(
        fused_store,
        "launch",
        lambda segments: launched[
            "other" if threading.current_thread().name == "other" else "main"
        ].append(len(segments)),
    )
    pool = torch.zeros(_SMALL_POOL, dtype=torch.float32)
    store = functools.partial(_store_role, pool)

    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        with fused_store.deferred():
            store(0)
            inside.set()
            done.wait(10)
            store(1)

    thread = threading.Thread(target=other, name="other")
    thread.start()
    inside.wait(10)
    with fused_store.deferred():
        store(0)
    assert launched == {"main": [1], "other": []}
    done.set()
    thread.join(10)
    assert launched == {"main": [1], "other": [2]}


def test_segments_of_different_destinations_cannot_share_a_launch() -> None:
    idx = torch.arange(4, dtype=torch.int64)
    one = torch.zeros((2, 8, 2, 16), dtype=torch.float32)
    other = torch.zeros((2, 8, 2, 16), dtype=torch.float32)
    rest = (idx, 8, (idx,), Recipe(key=1), 2, 16, 1.0, None)
    with pytest.raises(ValueError, match="different destinations"):
        fused_store.launch_arguments(
            [fused_store.Segment(one, *rest), fused_store.Segment(other, *rest)]
        )


def test_what_varies_from_case_to_case_builds_no_new_kernel() -> None:
    """Triton compiles a kernel per set of constexprs and per specialisation of the other
    integers and pointers (benchmarks/count_store_kernels.py): every argument that differs
    between launches of one head dim and dtype (the token counts, the recipes' steps, one or
    two token columns, a coded recipe, an index array's alignment, how many segments) must be
    one the kernel does not specialise on, or each case would build its own kernel (Run 30)."""
    pool = torch.zeros((64, 16, 4, 128), dtype=torch.bfloat16)

    def specialised(*calls: tuple[int, Recipe, bool, int]) -> dict[str, object]:
        segments = []
        for i, (tokens, recipe, two, offset) in enumerate(calls):
            idx = torch.arange(tokens + offset, dtype=torch.int64)[offset:]
            columns = (idx % 3, idx) if two else (idx,)
            dest = pool[8 * i : 8 * (i + 1)]
            segments.append(fused_store.Segment(dest, idx, 16, columns, recipe, 4, 128, 0.5, 448.0))
        launch = fused_store.launch_arguments(segments)
        assert launch is not None
        _, args = launch
        out: dict[str, object] = {}
        for name, value in args.items():
            if isinstance(value, torch.Tensor):
                aligned = name in fused_store.ARRAY_ARGS or value.data_ptr() % 16 == 0
                out[name] = (value.dtype, aligned)
            elif name not in fused_store.NOT_SPECIALISED:
                out[name] = value
        return out

    first = specialised((100, Recipe(key=1), False, 0))
    factor = torch.ones(33, dtype=torch.float64)
    base = torch.zeros(4, 128, dtype=torch.float64)
    for other in (
        specialised((33, Recipe(key=2, factor=factor, times=3.0, over=7.0), True, 1)),
        specialised((64, Recipe(key=3, base=base, scale=0.5), True, 0)),
        specialised((1, Recipe(key=4, coded=True), False, 3)),
        specialised((5, Recipe(key=5), False, 0), (33, Recipe(key=6, factor=factor), True, 2)),
    ):
        assert other == first
