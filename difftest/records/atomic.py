"""File writes a reader (or a crash) never sees torn, with the permissions the umask gives.

Many pytest-xdist workers and a killed campaign may write the same directory at once; each
whole-file write goes to a unique temporary file in the target directory, is flushed to disk,
and is renamed over the target, which POSIX makes atomic. Logs that grow (the findings of a
run, its write-ahead log) are appended a line at a time with one ``write`` each. Files get the
mode an ordinary ``open`` would give them (``0o666`` less the umask), so CI artifact steps and
other users can read them; the temporary file's private mode is not kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


FILE_MODE = 0o666 & ~_umask()
"""The mode new files get: what the process's umask allows (read once, at import)."""


def write_bytes(path: Path, data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file renamed over it.

    ``durable``: flush to the disk before the rename, so the file survives a power loss too.
    Without it the file still survives the writing process being killed (the kernel holds
    the data); write-ahead files, one per case, need only that.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str, *, durable: bool = True) -> Path:
    return write_bytes(path, text.encode("utf-8"), durable=durable)


def write_json(path: Path, data: Any, *, durable: bool = True) -> Path:
    text = json.dumps(data, indent=2, sort_keys=False, allow_nan=True) + "\n"
    return write_text(path, text, durable=durable)


def append_line(path: Path, line: str, *, durable: bool = False) -> None:
    """Append one line (``line`` must hold no newline) with a single ``write``, so lines of
    concurrent writers never interleave and a killed writer leaves at most a torn last line
    (readers skip it)."""
    assert "\n" not in line
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:  # the folder exists but for the first line (a mkdir per line cost more than the write)
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
