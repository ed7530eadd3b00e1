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
