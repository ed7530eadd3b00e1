"""The corpus options of the commands that use its known bugs (run, bench, triage, shrink):
``--corpus`` and ``--no-known``, each command saying what the known bugs do there."""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.records.corpus import DEFAULT_CORPUS


def add_corpus_arguments(p: argparse.ArgumentParser, known_bugs: str, without: str) -> None:
    """``--corpus`` ("the corpus whose known bugs ``known_bugs``") and ``--no-known``
    (``without``)."""
    p.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help=f"the corpus whose known bugs {known_bugs} (default: the one difftest ships)",
    )
    p.add_argument("--no-known", action="store_true", help=without)
