"""The error hierarchy and the exit codes every command returns.

A user error (bad input, bad configuration, missing library) is a :class:`DifftestError`;
the CLI prints its message on one line and exits with :attr:`ExitCode.USAGE`. Anything else
is an internal error and keeps its traceback.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes, documented in the README."""

    OK = 0
    """No finding: every case agreed, or every replayed repro is fixed."""
    FINDINGS = 1
    """At least one finding (or a replayed repro that still fails)."""
    USAGE = 2
    """Usage error, bad input (e.g. a malformed repro file) or a setup error."""
    INTERNAL = 3
    """A bug in difftest itself."""
    PIPE_CLOSED = 141
    """Whoever read the output closed it first (``difftest ... | head``): the status a shell
    gives a program that SIGPIPE ended."""


MAX_SHOWN = 60
"""The most characters of a value an error message quotes (an untrusted file's value can be
megabytes: a message names it, never echoes it)."""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def shown(value: object) -> str:
    """``repr(value)`` cut to :data:`MAX_SHOWN` characters; a long list or object is shown by
    its first items and its length."""
    if isinstance(value, (list, tuple, dict)) and len(value) > 8:
        head = list(value)[:8]
        return _cut(repr(head)[:-1]) + f", ... ({len(value)} items)]"
    return _cut(repr(value))


class DifftestError(Exception):
    """Root of every error difftest raises on purpose."""


class InvalidCase(DifftestError, ValueError):
    """A case spec violates a constraint; the message names the field and the value."""

    def __init__(self, field: str, value: object, why: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid case: {field}={shown(value)}: {why}")


class FormatError(DifftestError, ValueError):
    """A persisted file (case, repro, corpus entry) is malformed or of an unknown version."""

    def __init__(self, source: str, why: str) -> None:
        self.source = source
        super().__init__(f"{source}: {why}")


class UnknownPath(DifftestError, KeyError):
    """A kernel path name is not registered."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(name)
        self._message = f"unknown path {name!r}; registered paths: {', '.join(sorted(known))}"

    def __str__(self) -> str:
        return self._message


class PluginError(DifftestError, ImportError):
    """A ``--plugin`` module could not be imported."""


class SetupError(DifftestError, RuntimeError):
    """The environment cannot do what was asked (no GPU, library missing, ...)."""
