"""Which modules a library's on-disk JIT cache already holds, as far as difftest has built them.

Compile-ahead (:mod:`difftest.execution.compile_ahead`) starts a build process for every module
a campaign needs. When the module is already in the cache (an earlier campaign, a warmup, a
bench built it), that process only imports the library and loads the module, several seconds
each, and the campaign waits for it. The ledger is a JSON list of the build keys
(``(path, module key)``) whose build succeeded, kept in the cache folder itself, so that
removing the cache removes the ledger with it. A key in the ledger is not built again: the
worker loads the module on its first launch, as it would after any build.

The ledger is a hint, never a verdict: a module missing despite its entry is built by the
worker at its first launch (slower, not different), and a ledger that cannot be read or written
counts as empty.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Hashable, Iterable
from pathlib import Path

BuildKey = tuple[str, Hashable]
"""``(path name, module key)``: one module a path builds."""
LEDGER_NAME = "difftest-built-modules.json"


def flashinfer_ledger() -> BuiltModules | None:
    """The ledger of FlashInfer's JIT cache (``flashinfer.jit.env.FLASHINFER_JIT_DIR``: one per
    release, CUDA architecture list and ``FLASHINFER_WORKSPACE_BASE``), or ``None`` where
    FlashInfer is not installed or does not say where its cache is."""
    if importlib.util.find_spec("flashinfer") is None:
        return None
    try:
        from flashinfer.jit import env
    except Exception:  # a broken install: no ledger, builds as before
        return None
    folder = getattr(env, "FLASHINFER_JIT_DIR", None)
    return None if folder is None else BuiltModules(Path(folder) / LEDGER_NAME)


class BuiltModules:
    """The build keys recorded in the ledger file ``path`` (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._keys = self._read()

    @staticmethod
    def _name(key: BuildKey) -> str:
        return repr(key)

    def _read(self) -> set[str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return set()
        if not isinstance(data, list):
            return set()
        return {k for k in data if isinstance(k, str)}

    def __contains__(self, key: BuildKey) -> bool:
        return self._name(key) in self._keys

    def add(self, keys: Iterable[BuildKey]) -> None:
        """Record ``keys`` as built (merged with what other processes recorded meanwhile)."""
        names = {self._name(k) for k in keys} - self._keys
        if not names:
            return
        self._keys |= names | self._read()
        tmp: str | None = None
        try:  # whole or not at all: a temporary file beside it, renamed over it
            os.makedirs(self.path.parent, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(sorted(self._keys), f, indent=1)
            os.replace(tmp, self.path)
        except OSError:  # a read-only or full cache: the builds still happened
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # no half-written ledger left beside the cache
