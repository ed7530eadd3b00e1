"""A worker started by the command line before it imports torch.

An isolated campaign's first launch waits for its worker's start: importing torch, difftest's
evaluation and the kernel library (about 8 s on an H200 machine), then the device context.
A session starts its workers as it opens (:mod:`difftest.execution.isolation.early`), but by
then this process has spent its own seconds importing torch and every command. So the
``difftest`` console script starts one worker first of all, for the commands that run an
isolated campaign (:func:`wanted`), unconfigured (:meth:`WorkerProcess.preloading`); the
session's first early worker is that one, configured (:func:`take`). Whatever the command
does not take is stopped before it exits (:func:`discard`).

Which command runs is read from the raw arguments (the parser imports every command, which
is what the worker is to run beside): a misreading costs an idle worker stopped at the end,
or a worker started later, never a different result.
"""

from __future__ import annotations

from collections.abc import Sequence

from difftest.execution.isolation.worker import WorkerProcess

CAMPAIGN_COMMANDS = frozenset({"run", "bench"})
"""Commands whose sessions start their isolated workers as they open (``prestart``)."""

_waiting: WorkerProcess | None = None


def wanted(argv: Sequence[str]) -> bool:
    """Whether the command line ``argv`` (without the program name) runs an isolated campaign:
    a command of :data:`CAMPAIGN_COMMANDS` not given ``--isolation none`` (or an abbreviation
    argparse accepts) and not asking for help."""
    if not argv or argv[0] not in CAMPAIGN_COMMANDS:
        return False
    args = list(argv[1:])
    for i, arg in enumerate(args):
        if arg in ("-h", "--help"):
            return False
        name, eq, value = arg.partition("=")
        if len(name) > 2 and "--isolation".startswith(name):
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            if value == "none":
                return False
    return True


def start(argv: Sequence[str]) -> None:
    """Start the worker when ``argv`` :func:`wanted` one (once per process)."""
    global _waiting
    if _waiting is None and wanted(argv):
        _waiting = WorkerProcess.preloading()


def take() -> WorkerProcess | None:
    """The preloaded worker, unconfigured, for its caller to configure (``None`` when there
    is none, or it was taken already)."""
    global _waiting
    worker, _waiting = _waiting, None
    return worker


def discard() -> None:
    """Stop the preloaded worker if nothing took it."""
    worker = take()
    if worker is not None:
        worker.stop(1.0)
