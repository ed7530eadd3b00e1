"""Choosing the torch device a command runs on."""

from __future__ import annotations

import torch

from difftest.model.errors import SetupError


def pick_device(name: str | None) -> torch.device:
    """``name`` as a device, or cuda when a GPU is present, else cpu."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise SetupError(f"invalid --device {name!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SetupError(f"--device {name}: no CUDA GPU is visible to torch here")
    return device


def is_on(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether ``tensor`` lives on ``device`` as a caller names it: a device named without an
    index (``cuda``) is the current one of its type, while every tensor's device has an index
    (``cuda:0``), so ``tensor.device == device`` would be false there."""
    if tensor.device.type != device.type:
        return False
    if device.index is None:
        if device.type == "cuda":
            return tensor.device.index == torch.cuda.current_device()
        return True
    return tensor.device.index == device.index


def limit_memory(device: torch.device, share: float) -> None:
    """This process's CUDA allocator keeps to ``share`` of ``device``'s memory (an allocation
    past it raises ``torch.OutOfMemoryError``). torch's call takes only an indexed device or an
    index, so a device named ``cuda`` is given the current one's; off CUDA, nothing to bound."""
    if device.type != "cuda":
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    torch.cuda.set_per_process_memory_fraction(share, index)
