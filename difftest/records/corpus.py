"""The regression corpus: repro files with the outcome seen on each library version they ran on.

The default corpus ships with the package (``difftest/corpus/``, :data:`DEFAULT_CORPUS`).
``<name>.json`` describes one entry::

    {
      "format": "difftest-corpus/2",
      "repro": "<name>.repro.json",
      "description": "why this case matters",
      "expect": {"flashinfer": {"0.6.16.post4": "still_fails", "0.7.4": "still_fails"}},
      "known": {"path": "fi-decode-xqa", "kind": "WRONG", "detail": "tolerance",
                "trigger": ["bmm2_scale"]}
    }

``known`` (optional) declares the bug's group, in the trigger vocabulary of
:mod:`difftest.triage.features`: a campaign's group with that path, kind, detail and trigger
is labelled KNOWN with the entry's name (:func:`known_bugs`), its trigger is avoided by the
generators from the start, and the gate follows the entry's expectation for it instead of
failing on it.

``expect`` maps a library (a distribution name; ``flashinfer`` and ``torch`` are read from the
running environment) to the exact versions the entry was run on, each to the outcome seen
there: ``still_fails``, ``fixed`` or ``fails_differently``. These are facts, one per version,
never ranges: a version the entry was not run on has no expectation, and the gate and corpus
replay report the entry as *not checked on this version* (by name), never as a pass.
``difftest bisect ENTRY --versions ... --update-corpus`` records the outcome on each version
it ran. The key ``"*"`` (alone) maps straight to an outcome for every environment: for entries
whose paths depend on no versioned library (the planted CPU kernels of the test corpus).
:func:`replay_corpus` replays every entry; an entry whose path cannot run here is
``unavailable`` (not checked).

Format ``difftest-corpus/1`` carried version ranges, which claimed outcomes on releases an
entry never ran on; it is refused with the way to rewrite it.
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
from difftest.machine.environment import flashinfer_version, library_version
from difftest.model.errors import DifftestError, FormatError
from difftest.model.outcome import Outcome
from difftest.model.strict_json import Reader
from difftest.records.atomic import write_json
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import load_repro
from difftest.triage.features import feature_of_label
from difftest.triage.groups import KnownBug

CORPUS_FORMAT = "difftest-corpus/2"
LEGACY_FORMAT = "difftest-corpus/1"
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "corpus"
"""The corpus that ships with difftest (package data)."""
EXPECTABLE = ("still_fails", "fixed", "fails_differently")
ANY_VERSION = "*"
_VERDICT_OUTCOME = {
    Verdict.STILL_FAILS: "still_fails",
    Verdict.FAILS: "still_fails",
    Verdict.FIXED: "fixed",
    Verdict.PASSES: "fixed",
    Verdict.AGREES: "fixed",
    Verdict.FAILS_DIFFERENTLY: "fails_differently",
    Verdict.UNAVAILABLE: "unavailable",
}
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")

Expect = dict[str, str | dict[str, str]]
VersionOf = Callable[[str], str | None]


def installed_version(library: str) -> str | None:
    if library == "flashinfer":
        return flashinfer_version()
    if library == "torch":
        return str(torch.__version__)
    return library_version(library)


def outcome_of(verdict: Verdict) -> str:
    """The corpus outcome a replay verdict amounts to (``unavailable`` for a path that cannot
    run here)."""
    return _VERDICT_OUTCOME[verdict]


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    """What an entry expects in one environment: the outcome, or ``None`` when it has no
    expectation for the versions here; ``rule`` says which fact decided, or why none did."""

    outcome: str | None
    rule: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusEntry:
    name: str
    file: Path
    repro_file: Path
    description: str
    expect: Expect
    known: KnownBug | None = None

    def expectation(self, version_of: VersionOf = installed_version) -> Expectation:
        """The outcome this entry recorded for the versions installed here, if it has one."""
        if ANY_VERSION in self.expect:
            rule = self.expect[ANY_VERSION]
            assert isinstance(rule, str)
            return Expectation(outcome=rule, rule="any version")
        missing = []
        for library, facts in self.expect.items():
            assert isinstance(facts, dict)
            version = version_of(library)
            if version is not None and version in facts:
                return Expectation(outcome=facts[version], rule=f"seen on {library} {version}")
            seen = ", ".join(sorted(facts)) or "none"
            here = f"{library} {version}" if version is not None else f"{library} not installed"
            missing.append(f"{here} (recorded: {seen})")
        return Expectation(outcome=None, rule="not checked on this version: " + "; ".join(missing))

    def expected(self, version_of: VersionOf = installed_version) -> tuple[str | None, str]:
        """``(outcome, rule)`` for this environment; ``(None, why)`` when the entry has no
        expectation for the versions here."""
        e = self.expectation(version_of)
        return e.outcome, e.rule

    def versions(self, library: str) -> dict[str, str]:
        """The outcome recorded per version of ``library``."""
        facts = self.expect.get(library)
        return dict(facts) if isinstance(facts, dict) else {}


def _legacy_hint(source: str) -> FormatError:
    return FormatError(
        source,
        f"corpus format {LEGACY_FORMAT!r} (version ranges) is no longer read: rewrite it as "
        f"{CORPUS_FORMAT!r} with the exact versions the entry was run on, e.g. "
        '"expect": {"flashinfer": {"0.6.16.post4": "still_fails"}} '
        "(difftest bisect ENTRY --versions ... --update-corpus records them)",
    )


def _check_expect(expect: Any, source: str) -> Expect:
    if not isinstance(expect, dict) or not expect:
        raise FormatError(source, "expect must be a non-empty object")
    if ANY_VERSION in expect:
        if len(expect) != 1:
            raise FormatError(source, 'expect: "*" stands alone (it covers every environment)')
        if expect[ANY_VERSION] not in EXPECTABLE:
            raise FormatError(source, f"expect.*: outcomes must be in {EXPECTABLE}")
        return dict(expect)
    out: Expect = {}
    for library, facts in expect.items():
        if not isinstance(facts, dict) or not facts:
            raise FormatError(
                source, f"expect.{library} must map the versions it was run on to outcomes"
            )
        for version, outcome in facts.items():
            if not _VERSION.match(version):
                raise FormatError(
                    source,
                    f"expect.{library}: {version!r} is not a version (one exact version per "
                    "key, e.g. '0.7.4'; ranges are not facts)",
                )
            if outcome not in EXPECTABLE:
                raise FormatError(
                    source, f"expect.{library}.{version}: outcomes must be in {EXPECTABLE}"
                )
        out[library] = dict(facts)
    return out


def _read_entry_json(file: Path) -> dict[str, Any]:
    source = str(file)
    try:
        data: Any = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError(source, f"cannot read corpus entry: {e}") from None
    got = data.get("format") if isinstance(data, dict) else None
    if got == LEGACY_FORMAT:
        raise _legacy_hint(source)
    if not isinstance(data, dict) or got != CORPUS_FORMAT:
        raise FormatError(source, f"unknown corpus format {got!r}, expected {CORPUS_FORMAT!r}")
    return data


def load_entry(file: Path) -> CorpusEntry:
    """Read and check one ``<name>.json`` entry (the repro itself is read on replay)."""
    source = str(file)
    data = _read_entry_json(file)
    repro = data.get("repro")
    if not isinstance(repro, str) or Path(repro).name != repro:
        raise FormatError(source, f"repro must be a file name next to the entry, got {repro!r}")
    expect = _check_expect(data.get("expect"), source)
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


def entry_of_repro(repro_file: Path) -> Path | None:
    """The corpus entry beside ``repro_file`` that names it, if there is one."""
    name = repro_file.name
    if not name.endswith(".repro.json"):
        return None
    entry = repro_file.with_name(name.removesuffix(".repro.json") + ".json")
    if not entry.is_file():
        return None
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return entry if isinstance(data, dict) and data.get("repro") == name else None


def record_expectations(file: Path, library: str, outcomes: dict[str, str]) -> CorpusEntry:
    """Write the outcome seen on each version of ``library`` into the entry ``file`` (other
    versions' facts and every other key kept; a ``"*"`` expectation is replaced by the
    per-version facts). Returns the entry as written."""
    data = _read_entry_json(file)
    for version, outcome in outcomes.items():
        if outcome not in EXPECTABLE or not _VERSION.match(version):
            raise ValueError(f"cannot record {outcome!r} for {library} {version!r}")
    expect = data.get("expect") if isinstance(data.get("expect"), dict) else {}
    assert isinstance(expect, dict)
    expect.pop(ANY_VERSION, None)
    facts = dict(expect.get(library) or {})
    facts.update(outcomes)
    expect[library] = dict(sorted(facts.items(), key=lambda kv: _version_key(kv[0])))
    data["expect"] = expect
    write_json(file, data)
    return load_entry(file)


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    """Sort versions numerically where they are numbers (``0.6.9`` before ``0.6.16``)."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.+]", version))


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


def given_entries(folder: Path) -> list[CorpusEntry]:
    """The entries of a corpus folder a user named: a folder without any is a usage error."""
    found = entries(folder)
    if not found:
        raise DifftestError(f"{folder}: a folder with no corpus entries (NAME.json)")
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusOutcome:
    name: str
    expected: str | None
    """The entry's outcome for the versions here; ``None``: not checked on this version."""
    actual: str
    """``still_fails``, ``fixed``, ``fails_differently``, ``unavailable`` or ``error``."""
    rule: str
    detail: str

    @property
    def checked(self) -> bool:
        return self.expected is not None and self.actual != "unavailable"

    @property
    def ok(self) -> bool:
        """Checked and as expected (an entry not checked here is never a pass)."""
        return self.state == "ok"

    @property
    def state(self) -> Literal["ok", "unexpected", "not checked"]:
        if not self.checked:
            return "not checked"
        return "ok" if self.actual == self.expected else "unexpected"

    def line(self) -> str:
        if self.expected is None:
            return f"{self.name}: {self.rule}; replayed here: {self.actual}: {self.detail}"
        if self.actual == "unavailable":
            return (
                f"{self.name}: not checked here (expected {self.expected}; {self.rule}): "
                f"its path cannot run: {self.detail}"
            )
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
        actual=outcome_of(worst.verdict),
        rule=rule,
        detail=worst.detail,
    )


def replay_corpus(directory: Path | str, session: Session) -> list[CorpusOutcome]:
    """Replay every entry of ``directory`` in ``session``."""
    return [replay_entry(entry, session) for entry in entries(Path(directory))]
