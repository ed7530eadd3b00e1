"""The environment stamp a repro or report carries: GPU, driver, CUDA, library versions."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import re
import sys
from typing import Any

import torch


def version_tuple(version: str) -> tuple[int, ...]:
    """Leading numeric release components: ``"0.6.16.post4"`` -> ``(0, 6, 16)``; a pre-release
    tag (``"0rc1"``) ends the release numbers."""
    parts = []
    for piece in version.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.end() < len(piece):
            break
    return tuple(parts)


def library_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def flashinfer_version() -> str | None:
    """The installed flashinfer-python version (without importing it)."""
    return library_version("flashinfer-python") or _imported_flashinfer_version()


def _imported_flashinfer_version() -> str | None:
    module = sys.modules.get("flashinfer")
    return str(getattr(module, "__version__", "")) or None if module else None


def stamp(device: torch.device | str | None = None) -> dict[str, Any]:
    """Everything that says where a result was obtained (a fresh dict each call; the lookups
    behind it, a scan of installed packages and a driver query, run once per device)."""
    return dict(_stamp(str(device) if device is not None else None))


@functools.cache
def _stamp(device: str | None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "flashinfer": flashinfer_version(),
        "difftest": library_version("difftest"),
        "device": str(device) if device is not None else None,
        "cuda": torch.version.cuda,
        "gpu": None,
        "compute_capability": None,
        "driver": None,
    }
    if torch.cuda.is_available():
        index = torch.device(device).index if device is not None and str(device) != "cpu" else None
        idx = index or 0
        env["gpu"] = torch.cuda.get_device_name(idx)
        major, minor = torch.cuda.get_device_capability(idx)
        env["compute_capability"] = f"{major}.{minor}"
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{(version.value % 1000) // 10}"
    except OSError:
        return None
    return None
