"""A tensor is on the device a caller named, whether or not the name has an index.

Every tensor's device carries an index (``cuda:0``) while a command's device is named without
one (``cuda``, from ``--device`` or the default), and ``torch.device("cuda:0") ==
torch.device("cuda")`` is false: a launch's pool part checked that way was refused on every
GPU (docs/validation.md, Run 30). A CPU has no CUDA tensor, so the tensors here are stand-ins
that carry only a device, which is all :func:`is_on` reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from difftest.machine.device import is_on, limit_memory


def _on(name: str) -> torch.Tensor:
    return SimpleNamespace(device=torch.device(name))  # type: ignore[return-value]


def test_a_cuda_tensor_is_on_cuda_named_without_an_index_when_that_is_the_current_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert is_on(_on("cuda:1"), torch.device("cuda"))
    assert not is_on(_on("cuda:0"), torch.device("cuda"))
    assert torch.device("cuda:1") != torch.device("cuda")  # why the plain comparison fails


def test_an_index_must_match_and_a_type_always() -> None:
    assert is_on(_on("cuda:2"), torch.device("cuda:2"))
    assert not is_on(_on("cuda:2"), torch.device("cuda:3"))
    assert not is_on(_on("cpu"), torch.device("cuda:0"))
    assert not is_on(_on("cuda:0"), torch.device("cpu"))
    assert is_on(torch.zeros(1), torch.device("cpu"))


def test_a_memory_share_on_cuda_named_without_an_index_goes_to_the_current_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's ``set_per_process_memory_fraction`` refuses ``cuda`` without an index (what
    every pooled worker on a GPU was configured with until Run 30: none of them started)."""
    calls: list[tuple[float, object]] = []

    def like_torch(share: float, device: object) -> None:
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError(f"Expected a torch.device with a specified index, got {device}")
        calls.append((share, device))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", like_torch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    limit_memory(torch.device("cuda"), 0.25)
    limit_memory(torch.device("cuda:1"), 0.5)
    limit_memory(torch.device("cpu"), 0.5)  # host memory: not bounded
    assert calls == [(0.25, 2), (0.5, 1)]
