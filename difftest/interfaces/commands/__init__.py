"""Subcommands of the ``difftest`` CLI, one module each (discovered by
:mod:`difftest.interfaces.cli`)."""
