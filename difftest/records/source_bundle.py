"""Collecting source code for a standalone script: what :mod:`difftest.records.export` copies.

A :class:`Bundle` is asked for names (``require_name("Case", "difftest.model.case")``) or objects (a
path's run function). For each, it finds the top-level statement of its module that binds the
name (a ``def``, a ``class``, an assignment or an import) in the module's syntax tree, copies
it, and follows the names that statement reads: project code (difftest, its oracle and
generators, and plugin modules that are not installed packages) is copied, installed packages
are imported. Statements come out in dependency order (what a class body, decorator or
assignment needs is defined before it). Annotations are not followed: the script starts with
``from __future__ import annotations``, so they are never evaluated.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

from difftest.model.errors import DifftestError

PROJECT_PACKAGES = ("difftest", "oracles", "generators")


class BundleError(DifftestError):
    """Some code a script needs cannot be copied (the message names it)."""


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")]


def is_project(module: ModuleType) -> bool:
    """Copy (``True``) or import (``False``) what ``module`` defines."""
    top = module.__name__.split(".")[0]
    if top in PROJECT_PACKAGES or top.startswith("difftest_plugin_"):
        return True
    file = getattr(module, "__file__", None)
    if file is None:
        return False  # built-in modules
    where = Path(file).resolve()
    return not any(where.is_relative_to(root) for root in _installed_roots())


def _module(name_or_module: str | ModuleType) -> ModuleType:
    if isinstance(name_or_module, ModuleType):
        return name_or_module
    return importlib.import_module(name_or_module)


class _Free(ast.NodeVisitor):
    """Names a statement reads that it does not bind itself (annotations skipped)."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.bound: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.loads.append(node.id)
        else:
            self.bound.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        self.bound.add(node.arg)  # the annotation is skipped

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_alias(self, node: ast.alias) -> None:
        self.bound.add((node.asname or node.name).split(".")[0])

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)


def free_names(node: ast.AST) -> list[str]:
    finder = _Free()
    finder.visit(node)
    return list(dict.fromkeys(n for n in finder.loads if n not in finder.bound))


class Bundle:
    """Copied statements and imports, in dependency order."""

    def __init__(self) -> None:
        self._imports: dict[str, None] = {}
        self._chunks: list[str] = []
        self._bound: dict[str, tuple[str, int]] = {}
        self._trees: dict[str, tuple[ast.Module, str]] = {}
        self._renames: dict[tuple[str, str], str] = {}
        """``(module, name) -> name in the script``: a second definition of a name already
        copied from another module is copied under a name of its own."""

    def imports(self) -> str:
        plain = sorted(line for line in self._imports if line.startswith("import "))
        other = sorted(line for line in self._imports if not line.startswith("import "))
        return "".join(f"{line}\n" for line in [*plain, *other])

    def source(self) -> str:
        return "\n\n\n".join(self._chunks) + "\n"

    def require_object(self, obj: Any) -> None:
        """A function or class, under its own name, from the module that defines it."""
        self.require_name(obj.__name__, sys.modules[obj.__module__])

    def require_name(self, name: str, module: str | ModuleType) -> None:
        mod = _module(module)
        if not is_project(mod):
            self._import_from(name, mod.__name__, name)
            return
        stmt = self._binding(name, mod)
        if stmt is None:
            if hasattr(builtins, name):
                return
            raise BundleError(f"cannot find the definition of {name!r} in {mod.__name__}")
        if isinstance(stmt, ast.ImportFrom | ast.Import):
            self._follow_import(name, stmt, mod)
            return
        key = (mod.__name__, stmt.lineno)
        if (mod.__name__, name) in self._renames:
            return
        if name in self._bound:
            if self._bound[name] == key:
                return
            if len(_bound_names(stmt)) != 1:
                raise BundleError(
                    f"two definitions named {name!r} are needed ({self._bound[name][0]} and "
                    f"{mod.__name__}), one bound with other names; rename one to export"
                )
            # another module's definition of the name is copied already: this one gets its own
            new = f"{name}__{mod.__name__.split('.')[-1]}"
            while new in self._bound:
                new += "_"
            self._renames[(mod.__name__, name)] = new
            self._bound[new] = key
        else:
            for bound_name in _bound_names(stmt):
                self._bound.setdefault(bound_name, key)
            self._bound[name] = key
        for dep in free_names(stmt):
            if dep != name and dep not in _bound_names(stmt):
                self._require_global(dep, mod)
        self._chunks.append(self._text(stmt, mod))

    # -- internals ---------------------------------------------------------------------------

    def _require_global(self, name: str, mod: ModuleType) -> None:
        # A name with no top-level binding is a builtin or a local of a nested scope.
        if self._binding(name, mod) is not None:
            self.require_name(name, mod)

    def _import_from(self, name: str, module: str, attr: str) -> None:
        if module == "builtins":
            return
        alias = "" if attr == name else f" as {name}"
        self._imports[f"from {module} import {attr}{alias}"] = None

    def _follow_import(self, name: str, stmt: ast.Import | ast.ImportFrom, mod: ModuleType) -> None:
        value = getattr(mod, name)
        if isinstance(stmt, ast.Import):
            if isinstance(value, ModuleType) and is_project(value):
                raise BundleError(
                    f"{mod.__name__} uses the project module {value.__name__} as {name!r}; "
                    "export needs the functions it uses by name"
                )
            target = value.__name__ if isinstance(value, ModuleType) else name
            line = f"import {target}" if target == name else f"import {target} as {name}"
            self._imports[line] = None
            return
        if stmt.level:
            relative = "." * stmt.level + (stmt.module or "")
            source = importlib.import_module(relative, mod.__package__)
        else:
            source = importlib.import_module(stmt.module or "")
        attr = next(a.name for a in stmt.names if (a.asname or a.name) == name)
        if attr != name and is_project(source):
            raise BundleError(f"{mod.__name__} imports {attr!r} as {name!r}; cannot export")
        if isinstance(value, ModuleType):
            self._imports[f"import {value.__name__} as {name}"] = None
        elif is_project(source):
            defining = getattr(value, "__module__", None)
            origin = (
                sys.modules[defining]
                if (inspect.isfunction(value) or inspect.isclass(value)) and defining
                else source
            )
            self.require_name(name, origin)
            renamed = self._renames.get((origin.__name__, name))
            if renamed is not None:  # this module reads it under the name it was copied as
                self._renames[(mod.__name__, name)] = renamed
        else:
            self._import_from(name, source.__name__, attr)

    def _tree(self, mod: ModuleType) -> tuple[ast.Module, str]:
        cached = self._trees.get(mod.__name__)
        if cached is None:
            text = inspect.getsource(mod)
            cached = (ast.parse(text), text)
            self._trees[mod.__name__] = cached
        return cached

    def _binding(self, name: str, mod: ModuleType) -> ast.stmt | None:
        tree, _ = self._tree(mod)
        found = None
        for stmt in tree.body:
            if name in _bound_names(stmt):
                found = stmt
        return found

    def _text(self, stmt: ast.stmt, mod: ModuleType) -> str:
        _, text = self._tree(mod)
        lines = text.splitlines()
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
        end = stmt.end_lineno or stmt.lineno
        renames = {n: new for (m, n), new in self._renames.items() if m == mod.__name__}
        if renames:
            lines = _renamed(lines, stmt, renames)
        return "\n".join(lines[first - 1 : end])


def _renamed(lines: list[str], stmt: ast.stmt, renames: dict[str, str]) -> list[str]:
    """``lines`` with the names of ``renames`` replaced where ``stmt`` uses or defines them."""
    spots: list[tuple[int, int, str, str]] = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and node.id in renames:
            spots.append((node.lineno, node.col_offset, node.id, renames[node.id]))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node is stmt and node.name in renames:
                line = lines[node.lineno - 1]
                col = line.index(node.name, line.index("def " if "def " in line else "class "))
                spots.append((node.lineno, col, node.name, renames[node.name]))
    out = list(lines)
    for lineno, col, old, new in sorted(spots, reverse=True):
        line = out[lineno - 1]
        assert line[col : col + len(old)] == old
        out[lineno - 1] = line[:col] + new + line[col + len(old) :]
    return out


def _bound_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Assign):
        return {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id} if stmt.value is not None else set()
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    return set()
