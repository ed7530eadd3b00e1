"""Atomic file writes: a reader (or a crash) never sees a torn file.

Many pytest-xdist workers and a killed campaign may write the same directory at once; each
write goes to a unique temporary file in the target directory, is flushed to disk, and is
renamed over the target, which POSIX makes atomic.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(path: Path, data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` through a unique temporary file renamed over it.

    ``durable``: flush to the disk before the rename, so the file survives a power loss too.
    Without it the file still survives the writing process being killed (the kernel holds
    the data); write-ahead files, one per case, need only that.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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
