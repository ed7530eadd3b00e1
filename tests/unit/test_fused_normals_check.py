"""The fused normals' first-use check, on the CPU with the Triton kernel stood in for: a fused
form that agrees is used from then on; one whose bits differ is never used (its caller gets
the torch form's bits, and one warning). The kernel itself runs on a GPU only
(``tests/gpu/test_fused_normals.py``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from difftest.generation import fused_normals, rng


@pytest.fixture(autouse=True)
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fused_normals, "_checked", None)
    yield


def _prefix() -> torch.Tensor:
    return rng.mix(torch.arange(12, dtype=torch.int64)).view(3, 4)


def test_an_agreeing_fused_form_is_checked_once_then_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def fused(prefix: torch.Tensor, n: int) -> torch.Tensor:
        calls.append(n)
        return rng._torch_normals(prefix, n)

    monkeypatch.setattr(fused_normals, "fused", fused)
    out = fused_normals.normals(_prefix(), 5, rng._torch_normals)
    assert torch.equal(out, rng._torch_normals(_prefix(), 5))
    assert calls == [1, 67, 128, 5]  # the check's three widths, then the call itself
    fused_normals.normals(_prefix(), 9, rng._torch_normals)
    assert calls[-1] == 9 and len(calls) == 5  # checked once per process


def test_a_fused_form_with_other_bits_is_never_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def off_by_one_ulp(prefix: torch.Tensor, n: int) -> torch.Tensor:
        out = rng._torch_normals(prefix, n)
        return torch.nextafter(out, torch.full_like(out, 10.0))

    monkeypatch.setattr(fused_normals, "fused", off_by_one_ulp)
    with caplog.at_level(logging.WARNING, logger=fused_normals.__name__):
        out = fused_normals.normals(_prefix(), 5, rng._torch_normals)
    assert torch.equal(out.view(torch.int64), rng._torch_normals(_prefix(), 5).view(torch.int64))
    assert fused_normals._checked is False
    assert "differ from the torch form" in caplog.text
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not fused_normals.usable(_prefix())  # not even on a GPU, from then on


def test_a_fused_form_that_cannot_compile_is_not_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(prefix: torch.Tensor, n: int) -> torch.Tensor:
        raise RuntimeError("no compiler for this GPU")

    monkeypatch.setattr(fused_normals, "fused", broken)
    with caplog.at_level(logging.WARNING, logger=fused_normals.__name__):
        out = fused_normals.normals(_prefix(), 3, rng._torch_normals)
    assert torch.equal(out, rng._torch_normals(_prefix(), 3))
    assert "no compiler for this GPU" in caplog.text


def test_on_a_cpu_the_torch_or_numpy_form_runs() -> None:
    assert not fused_normals.usable(_prefix())
