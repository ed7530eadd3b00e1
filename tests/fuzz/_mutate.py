"""Mutations of real repro files, as bytes: what a damaged, edited or hostile file can be.

A repro is parsed once (:func:`load_seed`), mutated as a JSON tree (replace, delete, duplicate a
key, wrap, nest), serialised by :func:`dumps` (which can write what ``json.dumps`` cannot:
duplicate keys, raw text such as ``NaN`` or a 10,000-deep nesting), and optionally damaged as
bytes (truncation, byte flips, non-UTF-8 bytes). :func:`field_paths` walks every field path of
a tree, for the sweep that edits each one.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difftest.model import caps

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Raw:
    """Text written verbatim where a value goes (``NaN``, a 40-deep list, a 30-digit number)."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """An object written from its ``(key, value)`` pairs, so a key can appear twice."""

    items: tuple[tuple[str, Any], ...]


def dumps(value: Any) -> str:
    """JSON text of ``value``, with :class:`Raw` and :class:`Pairs` written as they say
    (iterative: a deep value does not recurse)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, Raw):
            out.append(v.text)
        elif isinstance(v, Pairs | dict):
            items = v.items if isinstance(v, Pairs) else tuple(v.items())
            parts: list[Any] = [Raw("}")]
            for i, (k, x) in enumerate(reversed(items)):
                parts.append(x)
                parts.append(Raw(json.dumps(str(k)) + ":"))
                if i < len(items) - 1:
                    parts.append(Raw(","))
            parts.append(Raw("{"))
            stack.extend(parts)
        elif isinstance(v, list | tuple):
            parts = [Raw("]")]
            for i, x in enumerate(reversed(v)):
                parts.append(x)
                if i < len(v) - 1:
                    parts.append(Raw(","))
            parts.append(Raw("["))
            stack.extend(parts)
        elif isinstance(v, float) and not math.isfinite(v):
            out.append("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
        else:
            out.append(json.dumps(v))
    return "".join(out)


def load_seed(file: Path) -> Any:
    return json.loads(file.read_text())


def field_paths(tree: Any) -> list[FieldPath]:
    """Every path to a value in ``tree`` (objects by key, lists by index), the root excluded;
    containers and leaves alike, in document order."""
    found: list[FieldPath] = []

    def walk(node: Any, at: FieldPath) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                found.append((*at, k))
                walk(v, (*at, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                found.append((*at, i))
                walk(v, (*at, i))

    walk(tree, ())
    return found


def get(tree: Any, path: FieldPath) -> Any:
    for step in path:
        tree = tree[step]
    return tree


def copy(tree: Any) -> Any:
    """A deep copy of a plain JSON tree (markers are immutable and shared)."""
    if isinstance(tree, dict):
        return {k: copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [copy(v) for v in tree]
    return tree


def replace(tree: Any, path: FieldPath, value: Any) -> Any:
    """A copy of ``tree`` with the value at ``path`` replaced."""
    new = copy(tree)
    parent = get(new, path[:-1])
    parent[path[-1]] = value
    return new


def delete(tree: Any, path: FieldPath) -> Any:
    """A copy of ``tree`` without the key (or list item) at ``path``."""
    new = copy(tree)
    parent = get(new, path[:-1])
    del parent[path[-1]]
    return new


def duplicate_key(tree: Any, path: FieldPath, value: Any) -> Any:
    """A copy of ``tree`` where the object holding ``path`` names its key twice: first with its
    own value, then with ``value`` (a JSON parser keeps one of them)."""
    new = copy(tree)
    parent_path, key = path[:-1], path[-1]
    parent = get(new, parent_path)
    if not isinstance(parent, dict):
        return new
    items = [*parent.items()]
    index = [k for k, _ in items].index(key)
    items.insert(index + 1, (key, value))
    pairs = Pairs(tuple(items))
    if not parent_path:
        return pairs
    grand = get(new, parent_path[:-1])
    grand[parent_path[-1]] = pairs
    return new


def nested(depth: int, leaf: str = "0") -> Raw:
    """A list nested ``depth`` deep around ``leaf``."""
    return Raw("[" * depth + leaf + "]" * depth)


def nested_objects(depth: int) -> Raw:
    return Raw('{"a":' * depth + "1" + "}" * depth)


# -- values an edit puts in place of a field ------------------------------------------------

HUGE_INTS = (
    10**12,
    2**31,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    10**24,  # the most digits read
    -(10**24),
)
RAW_HUGE = (Raw("1" + "0" * 24), Raw("-" + "9" * 30), Raw("1" * 5000), Raw("1e999"), Raw("-1e999"))
"""Numbers json.dumps would not write: more digits than read, and floats that overflow."""
EDGE_NUMBERS = (-1, 0, 1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 4096, 4097)
CAP_NUMBERS = (
    100_000,
    10**6,
    caps.MAX_SEQ_LEN - caps.MAX_Q_LEN,
    caps.MAX_SEQ_LEN - 1,
    caps.MAX_SEQ_LEN,
    caps.MAX_SEQ_LEN + 1,
    caps.MAX_SEED - 1,
    caps.MAX_POOL_ELEMENTS,
    caps.MAX_WORK,
)
"""At and around the caps of :mod:`difftest.model.caps` (inside them: large but valid)."""
FLOATS = (
    0.0,
    -0.0,
    0.5,
    1.0,
    1.5,
    -2.5,
    1e-300,
    5e-324,
    1e308,
    -1e308,
    caps.MAX_SCALE,
    1 / caps.MAX_SCALE,
    2.0**-33,
    2.0**33,
)
NON_FINITE = (math.nan, math.inf, -math.inf)
TEXTS = (
    "",
    "x",
    "0",
    "null",
    "NaN",
    "torch-sdpa",
    "planted-fixed",
    "WRONG",
    "AGREE",
    "UNSUPPORTED",
    "difftest-repro/1",
    "difftest-case/1",
    "../../etc/passwd",
    "/dev/zero",
    "é\u0000\u202e\U0001f600",
    "\ud800",  # a lone surrogate: json.dumps writes it escaped
    "x" * 4097,
)
CONTAINERS: tuple[Any, ...] = ([], {}, [0], [[]], {"": None}, [None], ["x"], {"format": 1})
SCALARS: tuple[Any, ...] = (None, True, False)
FORMATS = (
    "difftest-repro/0",
    "difftest-repro/2",
    "difftest-repro/1 ",
    "DIFFTEST-REPRO/1",
    "difftest-case/1",
    "",
    None,
    1,
    ["difftest-repro/1"],
)
CASE_FORMATS = ("difftest-case/0", "difftest-case/2", "difftest-repro/1", "", None, 1.0)


def giant_list(n: int, item: str = "0") -> Raw:
    return Raw("[" + ",".join([item] * n) + "]")


def heavy_values() -> tuple[Any, ...]:
    """Values that are large in themselves: deep nesting (under and over the cap), giant
    arrays, long strings."""
    return (
        nested(31),
        nested(33),
        nested(10_000),
        nested_objects(40),
        giant_list(5000),
        giant_list(200_000),
        giant_list(4097, '"x"'),
        giant_list(70, "{}"),
        Raw('"' + "a" * 100_000 + '"'),
    )


def numeric_neighbours(value: Any) -> tuple[Any, ...]:
    """Numbers near a numeric field's own value: off by one, doubled, negated, as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ()
    out: list[Any] = [-value, value * 2, value + 1, value - 1, float(value), value * 10**6]
    if isinstance(value, float):
        out += [value + 0.5, int(value) if math.isfinite(value) else 0]
    return tuple(out)


def all_values(current: Any) -> tuple[Any, ...]:
    """Every replacement value the sweep and the random edits draw from, for a field whose
    value is ``current``."""
    return (
        *SCALARS,
        *EDGE_NUMBERS,
        *CAP_NUMBERS,
        *HUGE_INTS,
        *RAW_HUGE,
        *FLOATS,
        *NON_FINITE,
        *TEXTS,
        *CONTAINERS,
        *numeric_neighbours(current),
        *heavy_values(),
        [current],
        {"value": current},
        str(current)[:100],
    )


def sweep_values(current: Any) -> tuple[Any, ...]:
    """The short list of replacements the CI sweep puts at every field path: one of each kind
    (null, a boolean, a string, a list, an object, the extremes of numbers, NaN) and the
    field's numeric neighbours."""
    return (
        None,
        True,
        "x",
        [],
        {},
        -1,
        0,
        4097,
        caps.MAX_SEQ_LEN - caps.MAX_Q_LEN,
        10**12,
        2**63,
        Raw("1" + "0" * 30),
        1e308,
        math.nan,
        math.inf,
        0.5,
        [current],
        *numeric_neighbours(current)[:2],
    )


# -- byte-level damage ----------------------------------------------------------------------

NON_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80")


def truncate(data: bytes, at: int) -> bytes:
    return data[: max(0, min(at, len(data)))]


def flip_bytes(data: bytes, rng: random.Random, count: int) -> bytes:
    if not data:
        return data
    buf = bytearray(data)
    for _ in range(count):
        i = rng.randrange(len(buf))
        buf[i] ^= rng.choice((0x01, 0x20, 0x80, 0xFF, rng.randrange(1, 256)))
    return bytes(buf)


def insert_bytes(data: bytes, at: int, chunk: bytes) -> bytes:
    at = max(0, min(at, len(data)))
    return data[:at] + chunk + data[at:]


def iter_sweep(tree: Any) -> Iterator[tuple[str, bytes]]:
    """Every field-targeted edit of ``tree``: for each field path, its deletion, a duplicate
    key, and each replacement of :func:`sweep_values`. Yields ``(label, file bytes)``."""
    for path in field_paths(tree):
        current = get(tree, path)
        label = "/".join(map(str, path))
        yield f"{label}: deleted", dumps(delete(tree, path)).encode()
        if isinstance(path[-1], str):
            yield f"{label}: twice", dumps(duplicate_key(tree, path, None)).encode()
        for value in sweep_values(current):
            shown = repr(value)[:40]
            yield f"{label} = {shown}", dumps(replace(tree, path, value)).encode()
