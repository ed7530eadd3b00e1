"""The gate's entry point (``difftest-gate``, ``ci/gate``): the gate is imported inside its
error handling, so an interpreter that lacks a required package (torch, say) gets one line and
exit 2 (:mod:`difftest.interfaces.requirements`), not an import traceback."""

from __future__ import annotations

import sys

from difftest.interfaces.requirements import said_missing
from difftest.model.errors import ExitCode


def console_main() -> None:
    try:
        from difftest.interfaces.gate.command import console_main as gate
    except Exception as e:
        if not said_missing(e, "gate"):
            raise
        sys.exit(ExitCode.USAGE)
    gate()
