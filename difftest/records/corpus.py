"""The regression corpus: repro files with the outcome expected per library version range.

The default corpus ships with the package (``difftest/corpus/``, :data:`DEFAULT_CORPUS`).
``<name>.json`` describes one entry::

    {
      "format": "difftest-corpus/1",
      "repro": "<name>.repro.json",
      "description": "why this case matters",
      "expect": {"flashinfer": {">=0.6.11,<0.7": "still_fails", ">=0.7": "fixed"}},
      "known": {"path": "fi-decode-xqa", "kind": "WRONG", "detail": "tolerance",
                "trigger": ["bmm2_scale"]}
    }

``known`` (optional) declares the bug's group, in the trigger vocabulary of
:mod:`difftest.triage.features`: a campaign's group with that path, kind, detail and trigger
is labelled KNOWN with the entry's name (:func:`known_bugs`), its trigger is avoided by the
generators from the start, and the gate follows the entry's expectation for it instead of
failing on it.

``expect`` maps a library (a distribution name; ``flashinfer`` and ``torch`` are read from the
running environment) to version ranges (comma-separated ``>=``, ``>``, ``<=``, ``<``, ``==``,
``!=`` clauses), each to an outcome: ``still_fails``, ``fixed`` or ``fails_differently``. The
key ``"*"`` maps straight to an outcome for every environment. Libraries are tried in order; the
first range that holds decides. :func:`replay_corpus` replays every entry; an entry whose path
cannot run here is ``unavailable`` (not checked), one with no matching range is unchecked.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from difftest.execution.session import Session
from difftest.machine.environment import flashinfer_version, library_version, version_tuple
from difftest.model.errors import DifftestError, FormatError
from difftest.model.outcome import Outcome
from difftest.model.strict_json import Reader
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import load_repro
from difftest.triage.features import feature_of_label
from difftest.triage.groups import KnownBug

CORPUS_FORMAT = "difftest-corpus/1"
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "corpus"
"""The corpus that ships with difftest (package data)."""
EXPECTABLE = ("still_fails", "fixed", "fails_differently")
_VERDICT_OUTCOME = {
    Verdict.STILL_FAILS: "still_fails",
    Verdict.FAILS: "still_fails",
    Verdict.FIXED: "fixed",
    Verdict.PASSES: "fixed",
    Verdict.AGREES: "fixed",
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
    known: KnownBug | None = None

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
    name = file.name.removesuffix(".json")
    description = str(data.get("description", ""))
    return CorpusEntry(
        name=name,
        file=file,
        repro_file=file.parent / repro,
        description=description,
        expect=expect,
        known=_known(data.get("known"), name, description, source),
    )


def _known(raw: Any, name: str, description: str, source: str) -> KnownBug | None:
    if raw is None:
        return None
    r = Reader(raw, source, "known").only("path", "kind", "detail", "against", "trigger")
    kind = r.text("kind", required=True)
    try:
        outcome = Outcome(kind)
    except ValueError:
        raise r.fail("kind", f"unknown outcome {kind!r}") from None
    trigger = r.texts("trigger", max_items=32)
    unknown = [t for t in trigger if feature_of_label(t) is None]
    if unknown:
        raise r.fail("trigger", f"unknown feature(s) {unknown}")
    return KnownBug(
        name=name,
        path=r.text("path", required=True),
        kind=outcome,
        detail=r.text("detail"),
        against=r.text("against", "oracle"),
        trigger=tuple(sorted(trigger)),
        description=description,
    )


def known_bugs(
    directory: Path | str = DEFAULT_CORPUS, version_of: VersionOf | None = None
) -> list[KnownBug]:
    """The known bugs the corpus in ``directory`` declares, each with its expectation on the
    versions installed here."""
    out = []
    for entry in entries(Path(directory)):
        if entry.known is not None:
            expected, _ = entry.expected(version_of or installed_version)
            out.append(dataclasses.replace(entry.known, expectation=expected))
    return out


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


def replay_entry(entry: CorpusEntry, session: Session) -> CorpusOutcome:
    """Replay one entry in ``session`` (isolated by default: a CRASH or HANG entry is an
    outcome, never the end of the gate)."""
    expected, rule = entry.expected()
    try:
        repro = load_repro(entry.repro_file)
        outcomes = replay_repro(repro, session, source=str(entry.repro_file))
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


def replay_corpus(directory: Path | str, session: Session) -> list[CorpusOutcome]:
    """Replay every entry of ``directory`` in ``session``."""
    return [replay_entry(entry, session) for entry in entries(Path(directory))]
