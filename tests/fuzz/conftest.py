"""The repro fuzzer's profiles and its report.

``DIFFTEST_FUZZ`` picks the profile: ``ci`` (default: 1,000 random inputs, each through the
four commands, and the sweep of two edits at every field path of eleven seeds, each through
one command: about 5,600 inputs and 8,600 runs, 2.5 CPU minutes), or ``nightly``
(10,000 random inputs, and the sweep makes every edit at every field path of every seed).
Whichever runs, the counts (inputs, runs per command and exit code, tracebacks, hangs, the
slowest run, the largest peak memory growth) are printed at the end of the session, from the
process that ran the fuzz tests (so not under ``pytest -n``):

    DIFFTEST_FUZZ=nightly pytest tests/fuzz -q
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _harness import REFUSALS, STATS, fuzz_registry


def pytest_configure(config: pytest.Config) -> None:
    profile = os.environ.get("DIFFTEST_FUZZ", "ci")
    if profile not in ("ci", "nightly"):
        raise pytest.UsageError(f"DIFFTEST_FUZZ={profile!r}: expected 'ci' or 'nightly'")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STATS.inputs:
        terminalreporter.section("repro fuzz counts")
        for line in STATS.lines():
            terminalreporter.write_line(line)
    if REFUSALS.runs:
        terminalreporter.section("named hostile inputs")
        for line in REFUSALS.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def registry() -> Iterator[None]:
    with fuzz_registry():
        yield
