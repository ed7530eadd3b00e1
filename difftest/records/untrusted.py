"""Reading a repro file as the untrusted input it is.

Repro files travel: attached to bug reports, downloaded from CI artifacts, passed between
teams. Loading one is as safe as loading a JSON file, and never more expensive:

- only a **regular file** under :data:`MAX_FILE_BYTES` is read (a FIFO, a device such as
  ``/dev/zero`` or a directory is refused before it is opened for reading);
- the JSON is parsed with its **nesting** bounded (:data:`MAX_DEPTH`) and its **integers**
  bounded to :data:`MAX_INT_DIGITS` digits, so no input reaches Python's recursion or
  big-integer limits;
- every field is validated (:func:`difftest.records.repro.load_repro` parses what
  :func:`read_json` returns, strictly typed:
  booleans are not integers) and the case against the caps of :mod:`difftest.model.caps`
  before anything is materialised; :func:`check_fits` then compares its memory estimate with
  what the device has free;
- nothing in the file is executed: its ``plugins`` are data (see
  :mod:`difftest.records.replay`), its tolerance decides nothing unless asked for.

Every refusal is a one-line :class:`~difftest.model.errors.FormatError` naming the file and
the field: the commands exit 2 with it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from difftest.model import caps
from difftest.model.case import Case
from difftest.model.errors import FormatError

MAX_FILE_BYTES = 8 << 20
"""The largest repro file read (a packed launch of 64 cases with results is under 1 MiB)."""
MAX_DEPTH = 32
"""The deepest JSON nesting a repro may have (a repro's own is 7)."""
MAX_INT_DIGITS = 24


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
"""A JSON string, to its closing quote (or the end of the text)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings: no recursion, and no Python loop
    over the text (regular expressions drop the strings and everything but brackets, numpy
    counts: an 8 MiB file in well under a second, whatever it holds)."""
    import numpy as np

    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    if not brackets:
        return 0
    data = np.frombuffer(brackets, dtype=np.uint8)
    opens = (data == ord("[")) | (data == ord("{"))
    steps = opens.view(np.int8) * np.int8(2) - np.int8(1)  # +1 opens, -1 closes
    return max(0, int(np.cumsum(steps, dtype=np.int32).max()))


def read_json(path: Path | str, *, what: str = "file") -> Any:
    """Parse ``path`` as JSON, as untrusted input (see the module docstring)."""
    p = Path(path)
    source = str(p)
    try:
        info = os.stat(p)
    except FileNotFoundError:
        raise FormatError(source, "no such file") from None
    except OSError as e:
        raise FormatError(source, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise FormatError(source, f"{kind}: a {what} must be a regular file")
    if info.st_size > MAX_FILE_BYTES:
        raise FormatError(source, f"{info.st_size} bytes: a {what} is at most {MAX_FILE_BYTES}")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                raise FormatError(source, f"not a regular file: a {what} must be one")
            data = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise FormatError(source, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise FormatError(source, f"more than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(source, f"not UTF-8 text (byte {e.start})") from None
    if _depth(text) > MAX_DEPTH:
        raise FormatError(source, f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise FormatError(
            source, f"not valid JSON (truncated?): {e.msg} at line {e.lineno}"
        ) from None
    except (ValueError, RecursionError) as e:
        raise FormatError(source, f"not valid JSON: {e}") from None


def check_fits(
    case: Case, device: torch.device, source: str, *, launch: Sequence[Case] = ()
) -> None:
    """Refuse a case whose estimated memory exceeds :data:`~difftest.model.caps.MEMORY_SHARE`
    of what ``device`` has free (before anything is allocated). ``launch``: the case runs
    packed with these (``case`` among them), all of them at once."""
    free = caps.free_memory(device.type, device.index)
    if free is None:
        return
    need = sum(c.estimated_bytes() for c in launch) if launch else case.estimated_bytes()
    if need > caps.MEMORY_SHARE * free:
        what = f"the launch of {len(launch)} cases" if launch else "the case"
        raise FormatError(
            source,
            f"{what} needs about {need / 2**30:.1f} GiB, more than half of the "
            f"{free / 2**30:.1f} GiB free on {device}",
        )
