"""Strict readers for parsed JSON: every record's ``from_json`` reads its fields through these.

Files difftest reads (repros, corpus entries, worker messages) are untrusted input. A field is
taken only when it has the expected JSON type: a boolean is never an integer (``"q_len": true``
is refused), an integer is never a float unless the field is a float (``1`` is accepted where a
float is expected; ``1.5`` is refused where an integer is), a float must be finite unless the
field allows otherwise. Every refusal is a :class:`~difftest.model.errors.FormatError` that
names the field (``result.results[0].metrics.max_abs``) and what was there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from difftest.model.errors import FormatError, shown

MAX_TEXT = 4096
"""Longest string a record field may hold (reasons, tracebacks are cut to lines before)."""


_show = shown


class Reader:
    """Typed access to one JSON object ``data`` found at ``where`` in ``source``."""

    def __init__(self, data: Any, source: str, where: str) -> None:
        if not isinstance(data, dict):
            raise FormatError(source, f"{where} must be a JSON object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.source = source
        self.where = where

    def fail(self, key: str, why: str) -> FormatError:
        return FormatError(self.source, f"{self.where}.{key}: {why}")

    def only(self, *keys: str) -> Reader:
        """Refuse keys other than ``keys`` (a record that carries unknown fields is from
        another version or was edited)."""
        unknown = sorted(set(self.data) - set(keys))
        if unknown:
            raise FormatError(self.source, f"{self.where}: unknown key(s) {shown(unknown)}")
        return self

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def _get(self, key: str, default: Any, required: bool) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.fail(key, "missing")
            return default
        return self.data[key]

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        value = self._get(key, default, required)
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_show(value)}")
        if len(value) > MAX_TEXT:
            raise self.fail(key, f"longer than {MAX_TEXT} characters")
        return value

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        required: bool = False,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = self._get(key, default, required)
        if value is None:
            return None
        return self.check_int(key, value, minimum, maximum)

    def check_int(
        self, key: str, value: Any, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_show(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be <= {maximum}, got {_show(value)}")
        return value

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        required: bool = False,
        finite: bool = True,
        minimum: float | None = None,
    ) -> float | None:
        value = self._get(key, default, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {_show(value)}")
        number = float(value)
        if finite and not math.isfinite(number):
            raise self.fail(key, f"must be finite, got {number}")
        if minimum is not None and not number >= minimum:
            raise self.fail(key, f"must be >= {minimum}, got {number}")
        return number

    def flag(self, key: str, default: bool = False, *, required: bool = False) -> bool:
        value = self._get(key, default, required)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_show(value)}")
        return value

    def items(self, key: str, *, required: bool = False, max_items: int = 4096) -> list[Any]:
        value = self._get(key, [], required)
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, got {type(value).__name__}")
        if len(value) > max_items:
            raise self.fail(key, f"more than {max_items} items")
        return value

    def integers(
        self, key: str, *, minimum: int | None = None, max_items: int = 4096
    ) -> tuple[int, ...]:
        return tuple(
            self.check_int(f"{key}[{i}]", v, minimum)
            for i, v in enumerate(self.items(key, max_items=max_items))
        )

    def texts(self, key: str, *, max_items: int = 4096) -> tuple[str, ...]:
        out = []
        for i, v in enumerate(self.items(key, max_items=max_items)):
            if not isinstance(v, str) or len(v) > MAX_TEXT:
                raise self.fail(f"{key}[{i}]", f"must be a string, got {_show(v)}")
            out.append(v)
        return tuple(out)

    def obj(self, key: str, *, required: bool = False) -> Reader | None:
        """The object at ``key`` as a reader (``None`` when absent or null)."""
        value = self._get(key, None, required)
        if value is None:
            return None
        return Reader(value, self.source, f"{self.where}.{key}")

    def objs(self, key: str, *, max_items: int = 4096) -> list[Reader]:
        return [
            Reader(v, self.source, f"{self.where}.{key}[{i}]")
            for i, v in enumerate(self.items(key, max_items=max_items))
        ]

    def float_map(self, key: str, *, max_items: int = 256) -> dict[str, float]:
        """An object of names to finite numbers (timings)."""
        inner = self.obj(key)
        if inner is None:
            return {}
        if len(inner.data) > max_items:
            raise self.fail(key, f"more than {max_items} entries")
        out: dict[str, float] = {}
        for name in inner.data:
            value = inner.number(name)
            out[name] = 0.0 if value is None else value
        return out

    def int_map(self, key: str, *, max_items: int = 256) -> dict[str, int]:
        inner = self.obj(key)
        if inner is None:
            return {}
        if len(inner.data) > max_items:
            raise self.fail(key, f"more than {max_items} entries")
        out: dict[str, int] = {}
        for name in inner.data:
            value = inner.integer(name, 0)
            out[name] = 0 if value is None else value
        return out
