"""The ``difftest`` command line: one subcommand per module of :mod:`difftest.interfaces.commands`.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``main(args) -> int`` (an :class:`~difftest.model.errors.ExitCode`). Common options (``--plugin``,
``--device``) are added here for every command. A :class:`~difftest.model.errors.DifftestError`
prints one line on stderr and exits 2, and so does a package difftest needs that this
interpreter lacks (:mod:`difftest.interfaces.requirements`); a closed output pipe ends quietly
with 141; anything else is an internal error (exit 3, traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType

from difftest.execution.interrupts import exit_process, for_the_process
from difftest.execution.isolation import preload
from difftest.interfaces.requirements import said_missing
from difftest.model.errors import DifftestError, ExitCode


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line, never a usage dump on stderr."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise DifftestError(f"{self.prog}: {message}")


def _commands() -> dict[str, ModuleType]:
    import difftest.interfaces.commands as pkg

    found = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"difftest.interfaces.commands.{info.name}")
        found[getattr(module, "NAME", info.name)] = module
    return found


def add_common(
    parser: argparse.ArgumentParser, device_default: str = "cuda if available, else cpu"
) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name or a .py file) that registers paths; repeatable",
    )
    parser.add_argument(
        "--device",
        default=None,
        help=f"torch device to run on (default: {device_default})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="difftest",
        description="Differential testing of speculative-decoding attention kernels.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _commands().items():
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        add_common(cmd, getattr(module, "DEVICE_DEFAULT", "cuda if available, else cpu"))
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "_main", None):
            parser.print_help()
            return ExitCode.USAGE
        from difftest.paths import load_plugin

        for plugin in args.plugin:
            load_plugin(plugin)
        return int(args._main(args))
    except DifftestError as e:
        print(f"difftest: error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except BrokenPipeError:
        discard_stdout()
        return ExitCode.PIPE_CLOSED
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except Exception as e:
        if _stopped_from_outside(e):  # a command that does not report its own interruption
            print(f"difftest: interrupted: {e}", file=sys.stderr)
            return ExitCode.FINDINGS
        if said_missing(e, "difftest"):
            return ExitCode.USAGE
        traceback.print_exc()
        print("difftest: internal error (a bug in difftest; please report it)", file=sys.stderr)
        return ExitCode.INTERNAL


def _stopped_from_outside(e: Exception) -> bool:
    """Whether ``e`` is an isolated worker's stop from outside
    (:class:`~difftest.execution.executors.StoppedFromOutside`), looked up only where its module
    is loaded (it imports torch; what raised it loaded it)."""
    executors = sys.modules.get("difftest.execution.executors")
    return executors is not None and isinstance(e, executors.StoppedFromOutside)


def discard_stdout() -> None:
    """The reader of stdout is gone: what is still buffered, and Python's flush at exit,
    go nowhere instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def console_main() -> None:
    """The ``difftest`` console script: SIGINT and SIGTERM (``timeout``, a CI runner
    cancelling) are handled for the whole process (:mod:`difftest.execution.interrupts`); an
    isolated campaign's first worker starts before anything else
    (:mod:`difftest.execution.isolation.preload`)."""
    for_the_process()
    preload.start(sys.argv[1:])
    try:
        code = main()
    finally:
        preload.discard()
    exit_process(code)
