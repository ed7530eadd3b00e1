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
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from difftest.campaign.report import CampaignReport
    from difftest.execution.session import Session

ROOT = Path(__file__).resolve().parents[1]
PLANTED_FILE = ROOT / "tests" / "fixtures" / "planted.py"
PLANTED_MODES_FILE = ROOT / "tests" / "fixtures" / "planted_modes.py"
CORPUS = ROOT / "tests" / "corpus"
"""The planted entries of the corpus (the default corpus ships with the package)."""
PACKAGE_CORPUS = ROOT / "difftest" / "corpus"


def _import_file(name: str, file: Path) -> ModuleType:
    """``file`` imported once, under the module name ``name`` (importing registers nothing)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def import_planted() -> ModuleType:
    """``tests/fixtures/planted.py`` under one module name (importing registers its paths)."""
    return _import_file("difftest_planted_fixture", PLANTED_FILE)


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


@pytest.fixture(name="planted_modes")
def planted_modes_fixture() -> Iterator[ModuleType]:
    """The planted production-mode kernels (``tests/fixtures/planted_modes.py``), registered
    for the test and unregistered afterwards."""
    module = _import_file("difftest_planted_modes_fixture", PLANTED_MODES_FILE)
    module.register_all()
    yield module
    module.unregister_all()


def corpus_repro(name: str, folder: Path, **changes: object) -> Path:
    """Copy ``tests/corpus/<name>.repro.json`` (or the package corpus's) into ``folder`` with
    the plugin path made absolute (and any top-level key changed)."""
    source = CORPUS / f"{name}.repro.json"
    if not source.exists():
        source = PACKAGE_CORPUS / f"{name}.repro.json"
    data = json.loads(source.read_text())
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


def campaign(
    out: Path,
    paths: tuple[str, ...],
    *,
    groups: int = 1,
    max_cases: int = 300,
    isolation: str = "none",
    plugins: tuple[str, ...] = (str(PLANTED_FILE),),
    seed: int = 0,
    **config: Any,
) -> CampaignReport:
    """A CPU campaign of ``paths`` that stops once ``groups`` groups are established with a
    minimal case (or after ``max_cases``)."""
    from difftest.campaign.loop import run_campaign
    from difftest.campaign.planning import CampaignConfig
    from difftest.execution.interrupts import Interrupts
    from difftest.execution.session import Session, Settings
    from difftest.triage.groups import Triage

    def enough(triage: Triage) -> bool:
        done = [g for g in triage.groups if g.established and g.minimal is not None and g.members]
        return len(done) >= groups

    settings = Settings(device="cpu", paths=paths, plugins=plugins, isolation=isolation)  # type: ignore[arg-type]
    cfg = CampaignConfig(seed=seed, max_cases=max_cases, out_dir=out, **config)
    with Session(settings, interrupts=Interrupts()) as session:
        return run_campaign(cfg, session, stop_when=enough)


def cpu_session(paths: tuple[str, ...] | None = None, **settings: Any) -> Session:
    """A CPU session with in-process execution unless told otherwise (close it, or use it as
    a context manager)."""
    from difftest.execution.interrupts import Interrupts
    from difftest.execution.session import Session, Settings

    fields: dict[str, Any] = {"device": "cpu", "paths": paths, "isolation": "none"}
    fields.update(settings)
    return Session(Settings(**fields), interrupts=Interrupts())
