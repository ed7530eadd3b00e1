"""The regression corpus: every CPU-runnable entry replays with the outcome it expects;
expectations are chosen by library version range; known bugs are read from the entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from _planted import CORPUS, PLANTED_FILE, cpu_session, one_torch_thread, planted_fixture  # noqa: F401

from difftest.model.errors import FormatError
from difftest.model.outcome import Outcome
from difftest.records.corpus import (
    DEFAULT_CORPUS,
    CorpusEntry,
    entries,
    in_range,
    known_bugs,
    load_entry,
    replay_corpus,
)
from difftest.records.schemas import load_schema, validate


def test_the_corpus_replays_as_expected_on_cpu(planted: ModuleType) -> None:
    with cpu_session(plugins=(str(PLANTED_FILE),)) as session:
        outcomes = replay_corpus(CORPUS, session)
    unexpected = [o.line() for o in outcomes if not o.ok]
    assert not unexpected, "\n".join(unexpected)
    checked = {o.name: o.actual for o in outcomes if o.checked}
    assert checked == {
        "planted-fixed": "fixed",
        "planted-page-stride": "still_fails",
        "planted-window": "still_fails",
    }
    assert {o.name for o in outcomes} == {e.name for e in entries(CORPUS)}


def test_the_shipped_corpus_declares_its_known_bugs_and_is_not_checked_without_a_gpu() -> None:
    known = {k.name: k for k in known_bugs(DEFAULT_CORPUS, {"flashinfer": "0.6.16.post4"}.get)}
    assert set(known) == {"xqa-bmm2-scale-ignored", "fmha-v2-bmm2-scale-ignored"}
    xqa = known["xqa-bmm2-scale-ignored"]
    assert (xqa.path, xqa.kind, xqa.trigger) == ("fi-decode-xqa", Outcome.WRONG, ("bmm2_scale",))
    assert xqa.expectation == "still_fails"
    with cpu_session() as session:
        outcomes = replay_corpus(DEFAULT_CORPUS, session)
    assert outcomes and all(o.state == "not checked" for o in outcomes)


def test_a_corpus_entry_with_an_unknown_feature_in_its_trigger_is_refused(
    tmp_path: Path,
) -> None:
    data = json.loads((DEFAULT_CORPUS / "xqa-bmm2-scale-ignored.json").read_text())
    data["known"]["trigger"] = ["bmm3_scale"]
    (tmp_path / "x.json").write_text(json.dumps(data))
    with pytest.raises(FormatError, match="unknown feature"):
        load_entry(tmp_path / "x.json")


def test_every_corpus_repro_satisfies_the_schema() -> None:
    for entry in [*entries(CORPUS), *entries(DEFAULT_CORPUS)]:
        data = json.loads(entry.repro_file.read_text())
        assert validate(data, load_schema("repro")) == [], entry.name


def test_an_unexpected_outcome_is_reported(tmp_path: Path, planted: ModuleType) -> None:
    shutil.copy(CORPUS / "planted-window.repro.json", tmp_path)
    entry = json.loads((CORPUS / "planted-window.json").read_text())
    entry["expect"] = {"*": "fixed"}
    (tmp_path / "planted-window.json").write_text(json.dumps(entry))
    with cpu_session(plugins=(str(PLANTED_FILE),)) as session:
        [outcome] = replay_corpus(tmp_path, session)
    assert not outcome.ok
    assert outcome.line().startswith(
        "planted-window: UNEXPECTED: still_fails (expected fixed; *): WRONG (tolerance)"
    )


@pytest.mark.parametrize(
    ("version", "spec", "holds"),
    [
        ("0.6.11", ">=0.6.11,<0.7", True),
        ("0.6.16.post4", ">=0.6.11,<0.7", True),
        ("0.7", ">=0.6.11,<0.7", False),
        ("0.7.0rc1", ">=0.7", True),
        ("0.6.10", ">=0.6.11", False),
        ("2.13.0+cpu", "==2.13", True),
        ("2.13.1", "!=2.13.1", False),
        ("1.0", ">0.9.9,<=1.0.0", True),
    ],
)
def test_version_ranges(version: str, spec: str, holds: bool) -> None:
    assert in_range(version, spec) is holds


def test_the_first_matching_range_decides(tmp_path: Path) -> None:
    entry = CorpusEntry(
        name="x",
        file=tmp_path / "x.json",
        repro_file=tmp_path / "x.repro.json",
        description="",
        expect={"flashinfer": {">=0.6.11,<0.6.17": "still_fails", ">=0.6.17": "fixed"}},
    )
    versions = {"flashinfer": "0.6.16.post4"}
    assert entry.expected(versions.get) == (
        "still_fails",
        "flashinfer 0.6.16.post4 in >=0.6.11,<0.6.17",
    )
    versions["flashinfer"] = "0.6.18"
    assert entry.expected(versions.get)[0] == "fixed"
    assert entry.expected({}.get) == (None, "no expectation for flashinfer None")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"format": "difftest-corpus/0"}, "unknown corpus format"),
        ({"repro": "../x.json"}, "file name next to the entry"),
        ({"expect": {}}, "non-empty"),
        ({"expect": {"*": "broken"}}, "outcomes must be in"),
        ({"expect": {"flashinfer": "fixed"}}, "must map version ranges"),
        ({"expect": {"flashinfer": {"~0.6": "fixed"}}}, "bad version range"),
    ],
)
def test_malformed_entries_are_format_errors(
    tmp_path: Path, body: dict[str, object], message: str
) -> None:
    data: dict[str, object] = {
        "format": "difftest-corpus/1",
        "repro": "x.repro.json",
        "expect": {"*": "fixed"},
    }
    data.update(body)
    file = tmp_path / "x.json"
    file.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=message):
        load_entry(file)
