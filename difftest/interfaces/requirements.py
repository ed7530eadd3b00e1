"""The packages difftest cannot run without, and the one line a missing one gets.

An interpreter without torch (say) is a setup error, not a bug in difftest: the command line
and the gate say which package is missing and exit 2, with no traceback. Nothing here imports
a requirement, so it works in exactly the interpreter that lacks one.
"""

from __future__ import annotations

import sys

REQUIRED = ("torch", "numpy", "hypothesis", "safetensors")
"""``pyproject.toml``'s dependencies, by the names they import as."""


def missing_requirement(exc: BaseException) -> str | None:
    """The required package whose import failed, if that is what ``exc`` is."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top in REQUIRED:
            return top
    return None


def missing_message(package: str) -> str:
    """The one line for a required package this interpreter lacks."""
    return (
        f"the package {package!r} is not installed in this Python ({sys.executable}); "
        "install difftest with its requirements (README: Install)"
    )


def said_missing(exc: BaseException, prog: str) -> bool:
    """When ``exc`` is a required package's failed import: its one line on stderr, headed
    ``prog: error:``, and ``True`` (the caller exits 2); else ``False``."""
    package = missing_requirement(exc)
    if package is None:
        return False
    sys.stderr.write(f"{prog}: error: {missing_message(package)}\n")
    return True
