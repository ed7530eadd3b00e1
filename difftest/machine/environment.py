"""The environment stamp a repro or report carries: GPU, driver, CUDA, library versions."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from difftest.model.strict_json import Reader


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment:
    """Where a result was obtained: the device, GPU, driver, CUDA and library versions."""

    python: str | None = None
    platform: str | None = None
    torch: str | None = None
    flashinfer: str | None = None
    difftest: str | None = None
    device: str | None = None
    cuda: str | None = None
    gpu: str | None = None
    compute_capability: str | None = None
    driver: str | None = None
    flashinfer_api: str | None = None
    """What the installed FlashInfer's API has, as the adapters detected it (one line)."""
    backends: str | None = None
    """The backend each path pins (``path=backend``, comma-separated); what actually ran is
    in each result."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, r: Reader | None) -> Environment:
        """Read leniently as to which keys are there (stamps of other versions carry other
        ones), strictly as to their types."""
        if r is None:
            return cls()
        return cls(**{f.name: r.text(f.name) or None for f in fields(cls)})

    def describe(self) -> str:
        """One line: device, GPU and arch, and the versions that matter."""
        gpu = (
            f" = {self.gpu} (sm {self.compute_capability}, driver {self.driver})"
            if self.gpu
            else ""
        )
        torch_v, fi_v = self.torch or "not installed", self.flashinfer or "not installed"
        versions = f"torch {torch_v}, flashinfer {fi_v}"
        api = f"; flashinfer API: {self.flashinfer_api}" if self.flashinfer_api else ""
        return f"device {self.device}{gpu}; {versions}; cuda {self.cuda or 'none'}{api}"


Note = Callable[[torch.device | str | None], "str | None"]
_NOTES: dict[str, Note] = {}


def provide(field_name: str, note: Note) -> None:
    """Have ``stamp`` fill ``field_name`` (``flashinfer_api``, ``backends``) from ``note``:
    the layers that know (the kernel paths) register what they detected, so this module
    imports none of them."""
    if field_name not in {f.name for f in fields(Environment)}:
        raise ValueError(f"Environment has no field {field_name!r}")
    _NOTES[field_name] = note
    stamp.cache_clear()


@functools.cache
def stamp(device: torch.device | str | None = None) -> Environment:
    """The environment of ``device`` (looked up once per device: a scan of installed
    packages and a driver query)."""
    name = str(device) if device is not None else None
    env = Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        torch=str(torch.__version__),
        flashinfer=flashinfer_version(),
        difftest=library_version("difftest"),
        device=name,
        cuda=torch.version.cuda,
    )
    if torch.cuda.is_available():
        index = torch.device(name).index if name is not None and name != "cpu" else None
        idx = index or 0
        major, minor = torch.cuda.get_device_capability(idx)
        env = dataclasses.replace(
            env,
            gpu=torch.cuda.get_device_name(idx),
            compute_capability=f"{major}.{minor}",
            driver=_driver_version(),
        )
    notes = {name: note(device) for name, note in _NOTES.items()}
    return dataclasses.replace(env, **{k: v for k, v in notes.items() if v})


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
