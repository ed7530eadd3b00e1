"""The regression corpus: repro files with the outcome expected per library version range.

``ci/corpus/<name>.json`` describes one entry::

    {
      "format": "difftest-corpus/1",
      "repro": "<name>.repro.json",
      "description": "why this case matters",
      "expect": {"flashinfer": {">=0.6.11,<0.7": "still_fails", ">=0.7": "fixed"}}
    }

``expect`` maps a library (a distribution name; ``flashinfer`` and ``torch`` are read from the
running environment) to version ranges (comma-separated ``>=``, ``>``, ``<=``, ``<``, ``==``,
``!=`` clauses), each to an outcome: ``still_fails``, ``fixed`` or ``fails_differently``. The
key ``"*"`` maps straight to an outcome for every environment. Libraries are tried in order; the
first range that holds decides. :func:`replay_corpus` replays every entry; an entry whose path
cannot run here is ``unavailable`` (not checked), one with no matching range is unchecked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from difftest.machine.environment import flashinfer_version, library_version, version_tuple
from difftest.model.errors import DifftestError, FormatError
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import load_repro

CORPUS_FORMAT = "difftest-corpus/1"
EXPECTABLE = ("still_fails", "fixed", "fails_differently")
_VERDICT_OUTCOME = {
    Verdict.STILL_FAILS: "still_fails",
    Verdict.FAILS: "still_fails",
    Verdict.FIXED: "fixed",
    Verdict.PASSES: "fixed",
    Verdict.FAILS_DIFFERENTLY: "fails_differently",
    Verdict.UNAVAILABLE: "unavailable",
}
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([0-9][0-9A-Za-z.+]*)\s*$")

Expect = dict[str, str | dict[str, str]]
VersionOf = Callable[[str], str | None]


def installed_version(library: str) -> str | None:
    if library == "flashinfer":
        return flashinfer_version()
    if library == "torch":
        return str(torch.__version__)
    return library_version(library)


def _compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    pa, pb = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (pa > pb) - (pa < pb)


def check_range(spec: str, source: str = "range") -> list[tuple[str, tuple[int, ...]]]:
    clauses = []
    for clause in spec.split(","):
        match = _CLAUSE.match(clause)
        if match is None:
            raise FormatError(source, f"bad version range {spec!r} (e.g. '>=0.6.11,<0.7')")
        clauses.append((match.group(1), version_tuple(match.group(2))))
    return clauses


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies every clause of ``spec``."""
    have = version_tuple(version)
    tests = {
        ">=": lambda c: c >= 0,
        ">": lambda c: c > 0,
        "<=": lambda c: c <= 0,
        "<": lambda c: c < 0,
        "==": lambda c: c == 0,
        "!=": lambda c: c != 0,
    }
    return all(tests[op](_compare(have, want)) for op, want in check_range(spec))


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusEntry:
    name: str
    file: Path
    repro_file: Path
    description: str
    expect: Expect

    def expected(self, version_of: VersionOf = installed_version) -> tuple[str | None, str]:
        """``(outcome, rule)`` for this environment; ``(None, why)`` when no rule holds."""
        for library, rule in self.expect.items():
            if library == "*":
                assert isinstance(rule, str)
                return rule, "*"
            version = version_of(library)
            if version is None or isinstance(rule, str):
                continue
            for spec, outcome in rule.items():
                if in_range(version, spec):
                    return outcome, f"{library} {version} in {spec}"
        libs = ", ".join(f"{lib} {version_of(lib)}" for lib in self.expect if lib != "*")
        return None, f"no expectation for {libs or 'this environment'}"


def load_entry(file: Path) -> CorpusEntry:
    """Read and check one ``<name>.json`` entry (the repro itself is read on replay)."""
    source = str(file)
    try:
        data: Any = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError(source, f"cannot read corpus entry: {e}") from None
    if not isinstance(data, dict) or data.get("format") != CORPUS_FORMAT:
        got = data.get("format") if isinstance(data, dict) else None
        raise FormatError(source, f"unknown corpus format {got!r}, expected {CORPUS_FORMAT!r}")
    repro = data.get("repro")
    if not isinstance(repro, str) or Path(repro).name != repro:
        raise FormatError(source, f"repro must be a file name next to the entry, got {repro!r}")
    expect = data.get("expect")
    if not isinstance(expect, dict) or not expect:
        raise FormatError(source, "expect must be a non-empty object")
    for library, rule in expect.items():
        outcomes = (
            [rule] if library == "*" else list(rule.values()) if isinstance(rule, dict) else []
        )
        if library != "*" and not isinstance(rule, dict):
            raise FormatError(source, f"expect.{library} must map version ranges to outcomes")
        if library != "*":
            for spec in rule:
                check_range(spec, source)
        bad = [o for o in outcomes if o not in EXPECTABLE]
        if bad or not outcomes:
            raise FormatError(source, f"expect.{library}: outcomes must be in {EXPECTABLE}")
    return CorpusEntry(
        name=file.name.removesuffix(".json"),
        file=file,
        repro_file=file.parent / repro,
        description=str(data.get("description", "")),
        expect=expect,
    )


def entries(directory: Path) -> list[CorpusEntry]:
    files = sorted(f for f in directory.glob("*.json") if not f.name.endswith(".repro.json"))
    return [load_entry(f) for f in files]


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusOutcome:
    name: str
    expected: str | None
    actual: str
    """``still_fails``, ``fixed``, ``fails_differently``, ``unavailable`` or ``error``."""
    rule: str
    detail: str

    @property
    def checked(self) -> bool:
        return self.expected is not None and self.actual != "unavailable"

    @property
    def ok(self) -> bool:
        return not self.checked or self.actual == self.expected

    @property
    def state(self) -> Literal["ok", "unexpected", "not checked"]:
        if not self.checked:
            return "not checked"
        return "ok" if self.ok else "unexpected"

    def line(self) -> str:
        status = "UNEXPECTED" if self.state == "unexpected" else self.state
        return (
            f"{self.name}: {status}: {self.actual} (expected {self.expected}; {self.rule}): "
            f"{self.detail}"
        )


def replay_entry(entry: CorpusEntry, device: torch.device) -> CorpusOutcome:
    expected, rule = entry.expected()
    try:
        repro = load_repro(entry.repro_file)
        outcomes = replay_repro(
            repro, device, source=str(entry.repro_file), repro_file=entry.repro_file
        )
    except DifftestError as e:
        return CorpusOutcome(
            name=entry.name, expected=expected, actual="error", rule=rule, detail=str(e)
        )
    worst = outcomes[0]
    return CorpusOutcome(
        name=entry.name,
        expected=expected,
        actual=_VERDICT_OUTCOME[worst.verdict],
        rule=rule,
        detail=worst.detail,
    )


def replay_corpus(directory: Path | str, device: torch.device | str = "cpu") -> list[CorpusOutcome]:
    """Replay every entry of ``directory`` on ``device``."""
    dev = torch.device(device)
    return [replay_entry(entry, dev) for entry in entries(Path(directory))]
