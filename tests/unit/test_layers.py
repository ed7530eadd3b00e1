"""The tree is the pipeline: no import cycle, and every import points down the pipeline.

The package's stages, in pipeline order (a stage may import the stages before it, never one
after it): model, machine, generation, oracle, paths, judgement, execution, reduction,
triage, records, campaign, calibration, interfaces. The oracle imports nothing of difftest.
Imports are read from the syntax tree of every module (those inside functions too), so a lazy
import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "difftest"
STAGES = (
    "model",
    "machine",
    "generation",
    "oracle",
    "paths",
    "judgement",
    "execution",
    "reduction",
    "triage",
    "records",
    "campaign",
    "calibration",
    "interfaces",
)


def _modules() -> dict[str, Path]:
    found = {}
    for file in PACKAGE.rglob("*.py"):
        parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = file
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, file: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if file.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("difftest"):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found = _resolve(full) if full in MODULES else _resolve(target)
                if found:
                    yield found
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("difftest") and (found := _resolve(alias.name)):
                    yield found


GRAPH = {m: set(_imports(m, f)) - {m} for m, f in MODULES.items()}


def _stage(module: str) -> int | None:
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_whole_package() -> None:
    assert {"difftest.model.case", "difftest.campaign.loop", "difftest.oracle.attention"} <= set(
        MODULES
    )
    assert "difftest.model.case" in GRAPH["difftest.generation.materialize"]
    # every module but the top-level package's belongs to a stage
    assert [m for m in MODULES if m != "difftest" and _stage(m) is None] == ["difftest.__main__"]


def test_there_is_no_import_cycle() -> None:
    assert _cycles() == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _stage(m) is not None))
def test_imports_point_down_the_pipeline(module: str) -> None:
    mine = _stage(module)
    assert mine is not None
    upward = [d for d in sorted(GRAPH[module]) if (s := _stage(d)) is not None and s > mine]
    assert upward == [], f"{module} imports later stages: {upward}"


def test_the_oracle_imports_nothing_of_difftest() -> None:
    oracle = [m for m in MODULES if m.startswith("difftest.oracle")]
    assert oracle and all(not GRAPH[m] - set(oracle) for m in oracle)


def test_a_cycle_would_be_found() -> None:
    # The check itself: two modules importing each other form a component.
    GRAPH["difftest.model.case"].add("difftest.model.batch")
    GRAPH["difftest.model.batch"].add("difftest.model.case")
    try:
        assert ["difftest.model.batch", "difftest.model.case"] in _cycles()
    finally:
        GRAPH["difftest.model.case"].discard("difftest.model.batch")
        GRAPH["difftest.model.batch"] = set(
            _imports("difftest.model.batch", MODULES["difftest.model.batch"])
        ) - {"difftest.model.batch"}


def test_building_the_cli_registers_no_mutant_path() -> None:
    """The CLI's parser (every command's options) is built without importing the self-test's
    mutants: their import registers 19 paths, and a process that builds a parser must not
    gain them (a test fixture that unregisters the paths it saw appear then left the module
    imported with its paths gone, and the mutants plugin could not be loaded again)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from difftest.interfaces.cli import build_parser\n"
        "from difftest.paths import all_paths\n"
        "build_parser()\n"
        "print('difftest.calibration.mutants' in sys.modules, "
        "any(p.name.startswith('mutant-') for p in all_paths()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]
