"""The workers the command line starts before it imports torch.

An isolated campaign's first launch waits for its worker's start: importing torch, difftest's
evaluation and the kernel library (about 8 s on an H200 machine), then the device context.
A session starts its workers as it opens (:mod:`difftest.execution.isolation.early`), but by
then this process has spent its own seconds importing torch and every command. So the
``difftest`` console script starts the campaign's workers first of all, for the commands that
run an isolated campaign (:func:`wanted`), unconfigured (:meth:`WorkerProcess.preloading`):
as many as the campaign will run launches in (:func:`count`: one on a GPU, one per usable core
on a CPU, or ``--workers``); the session's early workers are those, configured (:func:`take`).
Whatever the command does not take is stopped before it exits (:func:`discard`). (With one
worker preloaded, a two-core CPU campaign ran its first 1.5-2 s on one worker while the second
imported torch.)

Which command runs, and on what, is read from the raw arguments (the parser imports every
command, which is what the workers are to run beside) and, without ``--device``, from whether
an NVIDIA device node exists: a misreading costs an idle worker stopped at the end, or a worker
started later, never a different result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from difftest.execution.isolation.worker import WorkerProcess
from difftest.machine.cores import cpu_workers

CAMPAIGN_COMMANDS = frozenset({"run", "bench"})
"""Commands whose sessions start their isolated workers as they open (``prestart``)."""

_waiting: list[WorkerProcess] = []


def _option(argv: Sequence[str], option: str) -> str | None:
    """The value the command line ``argv`` gives ``option`` (``--name value``, ``--name=value``
    or an abbreviation argparse accepts); the last one given wins; ``None``: not given."""
    found = None
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if len(name) > 2 and option.startswith(name):
            found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return found


def wanted(argv: Sequence[str]) -> bool:
    """Whether the command line ``argv`` (without the program name) runs an isolated campaign:
    a command of :data:`CAMPAIGN_COMMANDS` not given ``--isolation none`` (or an abbreviation
    argparse accepts) and not asking for help."""
    if not argv or argv[0] not in CAMPAIGN_COMMANDS:
        return False
    args = list(argv[1:])
    if any(arg in ("-h", "--help") for arg in args):
        return False
    return _option(args, "--isolation") != "none"


def _gpu_here() -> bool:
    """Whether torch will likely see a CUDA device (without importing it): an NVIDIA device
    node, and ``CUDA_VISIBLE_DEVICES`` not hiding every device."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl")


def count(argv: Sequence[str]) -> int:
    """The workers an isolated campaign run by ``argv`` starts as it opens: ``--workers``
    when given, else one on a GPU and one per usable core on a CPU (what
    :func:`difftest.interfaces.commands._campaign_options.default_workers` decides once torch
    is imported); 0 when ``argv`` is not :func:`wanted`."""
    if not wanted(argv):
        return 0
    args = list(argv[1:])
    workers = _option(args, "--workers")
    if workers is not None:
        try:
            return max(1, int(workers))
        except ValueError:
            return 1  # the parser refuses it: the worker is stopped
    device = _option(args, "--device")
    if device is not None:
        return cpu_workers() if device.strip() == "cpu" else 1
    return 1 if _gpu_here() else cpu_workers()


def start(argv: Sequence[str]) -> None:
    """Start :func:`count` workers for ``argv``, unless started ones wait already."""
    if not _waiting:
        _waiting.extend(WorkerProcess.preloading() for _ in range(count(argv)))


def take() -> WorkerProcess | None:
    """A preloaded worker, unconfigured, for its caller to configure (``None`` when there is
    none left)."""
    return _waiting.pop(0) if _waiting else None


def discard() -> None:
    """Stop the preloaded workers nothing took."""
    while (worker := take()) is not None:
        worker.stop(1.0)
