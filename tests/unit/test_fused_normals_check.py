"""The fused normals' first-use check, on the CPU with the Triton kernel stood in for: a fused
form that agrees is used from then on; one whose bits differ is never used (its caller gets
the torch form's bits, and one warning). The kernel itself runs on a GPU only
(``tests/gpu/test_fused_normals.py``). And the torch form :func:`rng.token_normals` falls back
to is, by definition, the hash of each coordinate then the dim's normals."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pytest
import torch

from difftest.generation import fused_normals, rng

KEYS = (rng.key(3, rng.Stream.K), rng.key(3, rng.Stream.V))


@pytest.fixture(autouse=True)
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused_normals, "_checked", None)
    yield


def _columns() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([-1, 0, 5, 9]), torch.tensor([0, 1, 2, 300])


def _reference(keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int):  # type: ignore[no-untyped-def]
    return rng._torch_token_normals(keys, columns, heads, n)


def test_the_torch_form_is_the_hash_of_each_coordinate_then_normals() -> None:
    req, tok = _columns()
    out = rng.token_normals(KEYS, (req, tok), 3, 7)
    assert out.shape == (2, 4, 3, 7) and out.dtype == torch.float64
    for r, key in enumerate(KEYS):
        for i in range(4):
            for h in range(3):
                prefix = rng.hash_coords(
                    torch.tensor(key), req[i : i + 1], tok[i : i + 1], torch.tensor([h])
                )
                assert torch.equal(out[r, i, h], rng.normals(prefix, 7)[0])
    assert not torch.equal(out[0], out[1])  # the two keys draw different values


def test_an_agreeing_fused_form_is_checked_once_then_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def fused(keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int):  # type: ignore[no-untyped-def]
        calls.append(n)
        return _reference(keys, columns, heads, n)

    monkeypatch.setattr(fused_normals, "fused", fused)
    out = fused_normals.token_normals(KEYS, _columns(), 3, 5, _reference)
    assert torch.equal(out, _reference(KEYS, _columns(), 3, 5))
    assert calls == [1, 67, 128, 128, 5]  # the check's four samples, then the call itself
    fused_normals.token_normals(KEYS[:1], _columns()[:1], 2, 9, _reference)
    assert calls[-1] == 9 and len(calls) == 6  # checked once per process


def test_a_fused_form_with_other_bits_is_never_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def off_by_one_ulp(keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int):  # type: ignore[no-untyped-def]
        out = _reference(keys, columns, heads, n)
        return torch.nextafter(out, torch.full_like(out, 10.0))

    monkeypatch.setattr(fused_normals, "fused", off_by_one_ulp)
    with caplog.at_level(logging.WARNING, logger=fused_normals.__name__):
        out = fused_normals.token_normals(KEYS, _columns(), 3, 5, _reference)
    want = _reference(KEYS, _columns(), 3, 5)
    assert torch.equal(out.view(torch.int64), want.view(torch.int64))
    assert fused_normals._checked is False
    assert "differ from the torch form" in caplog.text
    monkeypatch.setattr(fused_normals, "_have_triton", lambda: True)
    assert not fused_normals.usable(torch.device("cuda"))  # not even on a GPU, from then on


def test_a_fused_form_that_cannot_compile_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int):  # type: ignore[no-untyped-def]
        raise RuntimeError("no compiler for this GPU")

    monkeypatch.setattr(fused_normals, "fused", broken)
    with caplog.at_level(logging.WARNING, logger=fused_normals.__name__):
        out = fused_normals.token_normals(KEYS, _columns(), 3, 3, _reference)
    assert torch.equal(out, _reference(KEYS, _columns(), 3, 3))
    assert "no compiler for this GPU" in caplog.text


def test_a_shape_the_kernel_does_not_cover_takes_the_torch_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fused(keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int):  # type: ignore[no-untyped-def]
        if not fused_normals.takes(keys, columns):
            raise AssertionError("called with a shape it does not cover")
        return _reference(keys, columns, heads, n)

    monkeypatch.setattr(fused_normals, "fused", fused)
    three = (*KEYS, rng.key(3, rng.Stream.Q))
    out = fused_normals.token_normals(three, _columns(), 2, 4, _reference)
    assert torch.equal(out, _reference(three, _columns(), 2, 4))


def test_on_a_cpu_the_torch_or_numpy_form_runs() -> None:
    assert not fused_normals.usable(torch.device("cpu"))
