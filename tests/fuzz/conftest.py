"""The repro fuzzer's profiles and its report.

``DIFFTEST_FUZZ`` picks the profile: ``ci`` (default: about 1,500 inputs, under three minutes
on two cores), or ``nightly`` (10,000 random inputs, and the sweep puts every replacement
value at every field path). Whichever runs, the counts (inputs, runs per command and exit
code, tracebacks, hangs, the slowest run, the largest peak memory growth) are printed at the
end of the session, from the process that ran the fuzz tests (so not under ``pytest -n``):

    DIFFTEST_FUZZ=nightly pytest tests/fuzz -q
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _harness import STATS, fuzz_registry


def pytest_configure(config: pytest.Config) -> None:
    profile = os.environ.get("DIFFTEST_FUZZ", "ci")
    if profile not in ("ci", "nightly"):
        raise pytest.UsageError(f"DIFFTEST_FUZZ={profile!r}: expected 'ci' or 'nightly'")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STATS.inputs:
        terminalreporter.section("repro fuzz counts")
        for line in STATS.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def registry() -> Iterator[None]:
    with fuzz_registry():
        yield
