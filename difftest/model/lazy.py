"""A package's public names imported on first use (PEP 562), so that importing the package
stays light: ``difftest`` itself (the pytest plugin imports it in every test session) and
:mod:`difftest.execution.isolation` (the command line starts a worker from it before it
imports torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_names(
    module: str, sources: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of package ``module``: each name of ``sources`` is
    imported from the module it maps to when first asked for, then kept in the package;
    ``names`` (its ``__all__``) are listed before they are."""

    def getattr_(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module], name, value)
        return value

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(names))

    return getattr_, dir_
