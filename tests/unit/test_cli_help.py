"""What ``--help`` says of a default is what the command does when the option is left out."""

from __future__ import annotations

import argparse

from difftest.interfaces.cli import build_parser


def _subcommand(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _device_help(name: str) -> str:
    [action] = [a for a in _subcommand(name)._actions if "--device" in a.option_strings]
    return action.help or ""


def test_selftest_says_it_runs_on_the_cpu_by_default() -> None:
    # It said "cuda if available, else cpu" while it picks "cpu" when --device is left out.
    assert _device_help("selftest").endswith("(default: cpu)")


def test_the_other_commands_keep_the_cuda_if_available_default() -> None:
    for name in ("run", "replay", "shrink", "explain"):
        assert _device_help(name).endswith("(default: cuda if available, else cpu)"), name
