"""JSON Schemas of the files difftest writes, and a small validator for the subset they use.

The subset: ``type`` (``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``,
``null``), ``const``, ``enum``, ``properties``, ``required``, ``additionalProperties``,
``items``, ``minItems``, ``maxItems``, ``minimum``, ``exclusiveMinimum``, ``minLength``,
``pattern``, ``anyOf`` and local ``$ref`` (``#/$defs/...``). Any other keyword is an error, so
a schema cannot silently ask for more than is checked.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}
_KNOWN = {
    "$schema", "$id", "$defs", "title", "description", "type", "const", "enum", "properties",
    "required", "additionalProperties", "items", "minItems", "maxItems", "minimum",
    "exclusiveMinimum", "minLength", "pattern", "anyOf", "$ref",
}  # fmt: skip


@cache
def load_schema(name: str) -> dict[str, Any]:
    """``load_schema("repro")``: the parsed ``<name>.schema.json``."""
    data: dict[str, Any] = json.loads((_HERE / f"{name}.schema.json").read_text("utf-8"))
    return data


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
    """Every violation of ``schema`` by ``instance``, as ``"<json path>: <problem>"``."""
    errors: list[str] = []
    _check(instance, schema, schema, "$", errors)
    return errors


def _check(value: Any, node: dict[str, Any], root: dict[str, Any], at: str, out: list[str]) -> None:
    unknown = set(node) - _KNOWN
    if unknown:
        raise ValueError(f"schema keyword(s) not supported at {at}: {sorted(unknown)}")
    if "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        _check(value, target, root, at, out)
    if "anyOf" in node:
        tries: list[list[str]] = [validate_in(value, sub, root, at) for sub in node["anyOf"]]
        if all(tries):
            # report the form that came closest, so the message names the offending field
            out.append(f"{at}: matches none of the allowed forms")
            closest: list[str] = min(tries, key=lambda errs: _closeness(errs, at))
            out.extend(closest)
    if "type" in node and not _is_type(value, node["type"]):
        out.append(f"{at}: expected {node['type']}, got {type(value).__name__}")
        return
    if "const" in node and value != node["const"]:
        out.append(f"{at}: must be {node['const']!r}, got {value!r}")
    if "enum" in node and value not in node["enum"]:
        out.append(f"{at}: {value!r} not in {node['enum']}")
    if isinstance(value, dict):
        _check_object(value, node, root, at, out)
    if isinstance(value, list):
        if len(value) < node.get("minItems", 0):
            out.append(f"{at}: fewer than {node['minItems']} items")
        if "maxItems" in node and len(value) > node["maxItems"]:
            out.append(f"{at}: more than {node['maxItems']} items")
        if "items" in node:
            for i, item in enumerate(value):
                _check(item, node["items"], root, f"{at}[{i}]", out)
    if _is_type(value, "number"):
        if "minimum" in node and value < node["minimum"]:
            out.append(f"{at}: {value} < minimum {node['minimum']}")
        if "exclusiveMinimum" in node and not value > node["exclusiveMinimum"]:
            out.append(f"{at}: {value} <= exclusive minimum {node['exclusiveMinimum']}")
    if isinstance(value, str):
        if len(value) < node.get("minLength", 0):
            out.append(f"{at}: shorter than {node['minLength']}")
        if "pattern" in node and re.search(node["pattern"], value) is None:
            out.append(f"{at}: {value!r} does not match {node['pattern']!r}")


def _closeness(errors: list[str], at: str) -> tuple[bool, int]:
    """Sort key: a form of the wrong type is farthest, then the one with fewer errors."""
    return errors[0].startswith(f"{at}: expected "), len(errors)


def validate_in(value: Any, node: dict[str, Any], root: dict[str, Any], at: str) -> list[str]:
    errors: list[str] = []
    _check(value, node, root, at, errors)
    return errors


def _check_object(
    value: dict[str, Any], node: dict[str, Any], root: dict[str, Any], at: str, out: list[str]
) -> None:
    for key in node.get("required", []):
        if key not in value:
            out.append(f"{at}: missing required key {key!r}")
    props = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            _check(item, props[key], root, f"{at}.{key}", out)
        elif extra is False:
            out.append(f"{at}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            _check(item, extra, root, f"{at}.{key}", out)
