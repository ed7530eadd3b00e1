"""Helpers for the repro-tooling tests: the planted-bug plugin (and a fixture registering it),
one torch thread, corpus repros copied with an absolute plugin path, and ``python -m difftest``
in a subprocess.

Import the fixtures into a test module to use them:
``from _planted import one_torch_thread, planted_fixture  # noqa: F401``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PLANTED_FILE = ROOT / "tests" / "fixtures" / "planted.py"
CORPUS = ROOT / "ci" / "corpus"


def import_planted() -> ModuleType:
    """``tests/fixtures/planted.py`` under one module name (importing registers its paths)."""
    name = "difftest_planted_fixture"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PLANTED_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These cases are tiny: one thread is fastest, and on a loaded machine more threads spin
    (a 2-core machine shared with other test runs was seen 30x slower with the default)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(name="planted")
def planted_fixture() -> Iterator[ModuleType]:
    """The planted-bug module with its paths registered (and unregistered afterwards)."""
    module = import_planted()
    module.register_all()
    yield module
    module.unregister_all()


def corpus_repro(name: str, folder: Path, **changes: object) -> Path:
    """Copy ``ci/corpus/<name>.repro.json`` into ``folder`` with the plugin path made absolute
    (and any top-level key changed)."""
    data = json.loads((CORPUS / f"{name}.repro.json").read_text())
    data["plugins"] = [str(PLANTED_FILE)]
    data.update(changes)
    out = folder / f"{name}.repro.json"
    out.write_text(json.dumps(data, indent=2))
    return out


def difftest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "difftest", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PYTHONPATH": str(ROOT),
            "PATH": "/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        },
    )
