"""README's layout section names every module of the package under its own subpackage, and
nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()


def _listed() -> dict[str, set[str]]:
    """Subpackage (``difftest/...``) -> the module files its lines name."""
    listed: dict[str, set[str]] = {}
    stack: list[str] = []
    current = None
    for line in _layout_block():
        head = re.match(r"^( *)([\w.]+/)\s", line + " ")
        if head:
            depth = len(head.group(1)) // 2
            stack = [*stack[:depth], head.group(2).rstrip("/")]
            current = "/".join(stack)
        if current is not None and current.startswith("difftest"):
            body = line[head.end() :] if head else line
            listed.setdefault(current, set()).update(re.findall(r"\b(\w+\.py)\b", body))
    return listed


def test_every_module_is_listed_under_its_subpackage() -> None:
    listed = _listed()
    actual: dict[str, set[str]] = {}
    for file in (ROOT / "difftest").rglob("*.py"):
        package = str(file.parent.relative_to(ROOT))
        if file.name != "__init__.py" or package == "difftest":
            actual.setdefault(package, set()).add(file.name)
    for package, modules in actual.items():
        assert modules <= listed.get(package, set()), (
            package,
            modules - listed.get(package, set()),
        )
    for package, modules in listed.items():
        assert modules <= actual.get(package, set()), (
            package,
            modules - actual.get(package, set()),
        )
