"""Stand-ins for ``flashinfer`` built from the recorded API of real releases
(``tests/data/flashinfer_api/<version>.json``, written by ``ci/record_flashinfer_api.py``): the
recorded functions and methods carry the recorded signatures, the classes have the recorded
properties. ``tests/unit/test_flashinfer_api.py`` runs detection on them; the GPU tests compare
the installed release with its record."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "flashinfer_api"


def _signature(params: list[list[Any]]) -> inspect.Signature:
    return inspect.Signature(
        [
            inspect.Parameter(
                name,
                getattr(inspect.Parameter, kind),
                default=inspect.Parameter.empty if default is None else default,
            )
            for name, kind, default in params
        ]
    )


def _function(name: str, params: list[list[Any]]) -> Any:
    def stand_in(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{name} is a recorded signature, not a kernel")

    stand_in.__name__ = name
    stand_in.__signature__ = _signature(params)  # type: ignore[attr-defined]
    return stand_in


def stand_in(record: dict[str, Any]) -> ModuleType:
    """A ``flashinfer`` with exactly the recorded functions, methods and properties."""
    fi = ModuleType("flashinfer")
    fi.__version__ = record["version"]  # type: ignore[attr-defined]
    modules: dict[str, Any] = {}
    for dotted, params in record["functions"].items():
        module, name = dotted.split(".")
        modules.setdefault(module, SimpleNamespace())
        setattr(modules[module], name, _function(name, params))
    for name, cls in record["classes"].items():
        body: dict[str, Any] = {m: _function(m, p) for m, p in cls["methods"].items()}
        body.update({p: property(lambda self: "fa2") for p in cls["properties"]})
        setattr(fi, name, type(name, (), body))
    for module, namespace in modules.items():
        setattr(fi, module, namespace)
    if "cake_batch_decode_with_kv_cache" in record["exports"]:
        fi.cake_batch_decode_with_kv_cache = modules["cake_fmha"].cake_batch_decode_with_kv_cache  # type: ignore[attr-defined]
    fi.decode = modules.get("decode", SimpleNamespace())  # type: ignore[attr-defined]
    fi.prefill = modules.get("prefill", SimpleNamespace())  # type: ignore[attr-defined]
    return fi


def record(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{version}.json").read_text())
    assert data["format"] == "difftest-flashinfer-api/1" and data["version"] == version
    return data
