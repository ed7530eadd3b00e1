"""Kernel paths: the registry and the built-in adapters (each registers itself on import)."""

from __future__ import annotations

from difftest.paths.registry import (
    KernelPath,
    Precision,
    all_paths,
    get_path,
    load_plugin,
    register,
    register_path,
    resolve,
    unregister,
)

__all__ = [
    "KernelPath",
    "Precision",
    "all_paths",
    "get_path",
    "load_plugin",
    "register",
    "register_path",
    "resolve",
    "unregister",
]


def _load_builtin() -> None:
    import importlib

    for module in _BUILTIN:
        importlib.import_module(f"difftest.paths.{module}")


_BUILTIN = [
    "torch_sdpa",
    "torch_online",
    "flashinfer_decode",
    "flashinfer_context",
    "flashinfer_wrappers",
    "flashinfer_xqa_ragged",
    "flashinfer_modes",
]
"""Built-in path modules, in report order. Each imports its kernel library lazily."""

_load_builtin()
