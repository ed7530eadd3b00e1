#!/usr/bin/env python3
"""Record the parts of a FlashInfer release's API that difftest's detection reads.

Reads the Python sources of an unpacked ``flashinfer_python`` wheel (or an installed site
folder) with ``ast``; nothing is imported, so any release can be recorded on any machine.
The record (``tests/data/flashinfer_api/<version>.json``) holds, for the functions and wrapper
methods :mod:`difftest.paths.flashinfer_api` inspects, each parameter's name, kind and default
as written, and the names of the properties each wrapper class defines. The CPU tests build
stand-ins from it and pin what :func:`~difftest.paths.flashinfer_api.detect` says of each
release.

Usage: python3 ci/record_flashinfer_api.py UNPACKED_DIR OUT.json
(UNPACKED_DIR contains ``flashinfer/``; the version is read from ``flashinfer/_build_meta.py``
or the ``*.dist-info/METADATA`` beside it.)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

RECORD_FORMAT = "difftest-flashinfer-api/1"
FUNCTIONS = {
    "decode.trtllm_batch_decode_with_kv_cache": "flashinfer/decode.py",
    "prefill.trtllm_batch_context_with_kv_cache": "flashinfer/prefill.py",
    "prefill.trtllm_fmha_v2_prefill": "flashinfer/prefill.py",
    "prefill._check_paged_kv_non_interleaved": "flashinfer/prefill.py",
    "cake_fmha.cake_batch_decode_with_kv_cache": "flashinfer/cake_fmha.py",
}
"""Function (module.name) -> the file that defines it, where the release has it."""
CLASSES = {
    "BatchDecodeWithPagedKVCacheWrapper": "flashinfer/decode.py",
    "BatchPrefillWithPagedKVCacheWrapper": "flashinfer/prefill.py",
}
METHODS = ("__init__", "plan", "_plan_impl", "run")
EXPORTS = ("cake_batch_decode_with_kv_cache", *CLASSES)
"""Top-level names of ``flashinfer`` whose presence is recorded."""
_KINDS = {"posonly": "POSITIONAL_ONLY", "args": "POSITIONAL_OR_KEYWORD", "kwonly": "KEYWORD_ONLY"}


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[list[Any]]:
    """``[name, kind, default]`` per parameter, in order (kinds as ``inspect.Parameter``)."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += list(a.defaults)
    out: list[list[Any]] = []
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = _KINDS["posonly"] if i < len(a.posonlyargs) else _KINDS["args"]
        out.append([arg.arg, kind, _text(default)])
    if a.vararg is not None:
        out.append([a.vararg.arg, "VAR_POSITIONAL", None])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append([arg.arg, _KINDS["kwonly"], _text(default)])
    if a.kwarg is not None:
        out.append([a.kwarg.arg, "VAR_KEYWORD", None])
    return out


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    """The last top-level ``def``/``class`` of ``name`` (the one a module ends up binding)."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                found = node
    return found


def _is_property(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_text(d) in ("property", "functools.cached_property") for d in fn.decorator_list)


def _exports(root: Path) -> list[str]:
    init = root / "flashinfer" / "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return sorted(n for n in EXPORTS if n in names)


def _version(root: Path) -> str:
    meta = root / "flashinfer" / "_build_meta.py"
    if meta.is_file():
        match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", meta.read_text())
        if match:
            return match.group(1)
    for md in root.glob("*.dist-info/METADATA"):
        for line in md.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    raise SystemExit(f"{root}: no flashinfer version found (_build_meta.py or METADATA)")


def record(root: Path) -> dict[str, Any]:
    trees: dict[str, ast.Module] = {}

    def tree(rel: str) -> ast.Module | None:
        file = root / rel
        if not file.is_file():
            return None
        if rel not in trees:
            trees[rel] = ast.parse(file.read_text(encoding="utf-8"))
        return trees[rel]

    functions: dict[str, Any] = {}
    for dotted, rel in FUNCTIONS.items():
        module = tree(rel)
        node = _top_level(module, dotted.split(".")[-1]) if module else None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions[dotted] = parameters(node)
    classes: dict[str, Any] = {}
    for name, rel in CLASSES.items():
        module = tree(rel)
        node = _top_level(module, name) if module else None
        if not isinstance(node, ast.ClassDef):
            continue
        defs = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        classes[name] = {
            "module": rel.removeprefix("flashinfer/").removesuffix(".py"),
            "methods": {d.name: parameters(d) for d in defs if d.name in METHODS},
            "properties": sorted({d.name for d in defs if _is_property(d)}),
        }
    return {
        "format": RECORD_FORMAT,
        "version": _version(root),
        "functions": functions,
        "classes": classes,
        "exports": _exports(root),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    root, out = Path(argv[0]), Path(argv[1])
    if not (root / "flashinfer" / "__init__.py").is_file():
        print(f"{root}: no flashinfer/__init__.py here", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record(root), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
