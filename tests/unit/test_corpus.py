"""The regression corpus: every CPU-runnable entry replays with the outcome it expects;
expectations are facts per exact library version (a version without one is "not checked on
this version", never a pass); known bugs are read from the entries."""

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
    known_bugs,
    load_entry,
    record_expectations,
    replay_corpus,
)
from difftest.records.schemas import load_schema, validate


def test_the_corpus_replays_as_expected_on_cpu(planted: ModuleType) -> None:
    with cpu_session(plugins=(str(PLANTED_FILE),)) as session:
        outcomes = replay_corpus(CORPUS, session)
    unexpected = [o.line() for o in outcomes if o.state == "unexpected"]
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
    assert set(known) == {
        "xqa-bmm2-scale-ignored",
        "fmha-v2-bmm2-scale-ignored",
        "fa2-finite-mask-fill",
        "decode-wrapper-finite-mask-fill",
        "xqa-sglang-draft-length-mask",
        "xqa-ragged-bmm2-scale-ignored",
        "fa2-graph-mode-bits",
        "xqa-graph-captured-bmm2-scale",
        "fa2-sentinel-logit",
        "decode-wrapper-sentinel-logit",
        "xqa-fp8-long-row-scale",
        "xqa-fp8-long-row-small-group",
        "xqa-bf16-large-logit-row",
        "xqa-bf16-long-row-randn",
    }
    xqa = known["xqa-bmm2-scale-ignored"]
    assert (xqa.path, xqa.kind, xqa.trigger) == ("fi-decode-xqa", Outcome.WRONG, ("bmm2_scale",))
    assert xqa.expectation == "still_fails"
    fill = known["fa2-finite-mask-fill"]
    assert (fill.path, fill.trigger) == ("fi-prefill-fa2", ("q_scale", "sm_scale"))
    sentinel = known["fa2-sentinel-logit"]
    assert (sentinel.path, sentinel.trigger) == ("fi-prefill-fa2", ("head_dim>64", "value_scale"))
    assert sentinel.expectation == "still_fails"
    long_row = known["xqa-fp8-long-row-scale"]
    assert long_row.trigger == (
        "L>4",
        "group>4",
        "kv_fp8",
        "prefix>4096",
        "requests>16",
        "value_scale",
        "values=position_coded",
    )
    assert long_row.expectation == "still_fails"
    small_group = known["xqa-fp8-long-row-small-group"]
    assert small_group.trigger == (
        "group>1",
        "kv_fp8",
        "prefix>8192",
        "requests>8",
        "value_scale",
        "values=position_coded",
    )
    assert small_group.expectation is None  # run on 0.7.4 only: no fact for 0.6.16.post4
    large = known["xqa-bf16-large-logit-row"]
    assert large.trigger == (
        "L>1",
        "head_dim>32",
        "prefix>8192",
        "requests>128",
        "values=large_logits",
    )
    assert large.expectation == "still_fails"
    randn = known["xqa-bf16-long-row-randn"]
    assert randn.trigger == (
        "L>1",
        "head_dim>16",
        "page_size>16",
        "prefix>1024",
        "requests>64",
        "shared_pages",
        "value_scale",
    )
    assert randn.expectation is None  # run on 0.7.4 only: no fact for 0.6.16.post4
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
        "planted-window: UNEXPECTED: still_fails (expected fixed; any version): WRONG (tolerance)"
    )


def _entry(tmp_path: Path, expect: dict[str, object]) -> CorpusEntry:
    return CorpusEntry(
        name="x",
        file=tmp_path / "x.json",
        repro_file=tmp_path / "x.repro.json",
        description="",
        expect=expect,  # type: ignore[arg-type]
    )


def test_an_expectation_is_the_outcome_seen_on_that_exact_version(tmp_path: Path) -> None:
    entry = _entry(tmp_path, {"flashinfer": {"0.6.16.post4": "still_fails", "0.7.4": "fixed"}})
    assert entry.expected({"flashinfer": "0.6.16.post4"}.get) == (
        "still_fails",
        "seen on flashinfer 0.6.16.post4",
    )
    assert entry.expected({"flashinfer": "0.7.4"}.get)[0] == "fixed"
    # Between two recorded releases is not covered by either: no range is implied.
    outcome, rule = entry.expected({"flashinfer": "0.7.2"}.get)
    assert outcome is None
    assert rule == ("not checked on this version: flashinfer 0.7.2 (recorded: 0.6.16.post4, 0.7.4)")
    assert entry.expected({}.get) == (
        None,
        "not checked on this version: flashinfer not installed (recorded: 0.6.16.post4, 0.7.4)",
    )
    assert _entry(tmp_path, {"*": "fixed"}).expected({}.get) == ("fixed", "any version")


def test_an_entry_not_checked_on_this_version_is_reported_by_name_and_is_no_pass(
    tmp_path: Path, planted: ModuleType
) -> None:
    shutil.copy(CORPUS / "planted-window.repro.json", tmp_path)
    entry = json.loads((CORPUS / "planted-window.json").read_text())
    entry["expect"] = {"torch": {"0.0.1": "still_fails"}}  # a torch release nobody runs
    (tmp_path / "planted-window.json").write_text(json.dumps(entry))
    with cpu_session(plugins=(str(PLANTED_FILE),)) as session:
        [outcome] = replay_corpus(tmp_path, session)
    assert outcome.state == "not checked" and not outcome.ok and not outcome.checked
    assert outcome.actual == "still_fails"  # it was replayed, and the line says what it did
    assert outcome.line().startswith("planted-window: not checked on this version: torch "), (
        outcome.line()
    )
    assert "(recorded: 0.0.1); replayed here: still_fails: WRONG" in outcome.line()


def test_a_known_bug_without_an_expectation_here_fails_the_gate_as_unexpected() -> None:
    known = {k.name: k for k in known_bugs(DEFAULT_CORPUS, {"flashinfer": "0.7.2"}.get)}
    assert known["xqa-bmm2-scale-ignored"].expectation is None


def test_bisect_records_outcomes_per_version_keeping_the_rest(tmp_path: Path) -> None:
    for f in ("xqa-bmm2-scale-ignored.json", "xqa-bmm2-scale-ignored.repro.json"):
        shutil.copy(DEFAULT_CORPUS / f, tmp_path)
    file = tmp_path / "xqa-bmm2-scale-ignored.json"
    before = json.loads(file.read_text())
    entry = record_expectations(file, "flashinfer", {"0.7.4": "still_fails", "0.6.9": "fixed"})
    after = json.loads(file.read_text())
    assert after["expect"] == {
        "flashinfer": {"0.6.9": "fixed", "0.6.16.post4": "still_fails", "0.7.4": "still_fails"}
    }
    assert {k: v for k, v in after.items() if k != "expect"} == {
        k: v for k, v in before.items() if k != "expect"
    }
    assert entry.versions("flashinfer")["0.7.4"] == "still_fails"
    with pytest.raises(ValueError, match="cannot record"):
        record_expectations(file, "flashinfer", {"0.7.4": "crash"})


def test_the_shipped_entries_record_only_the_version_they_were_run_on() -> None:
    for entry in entries(DEFAULT_CORPUS):
        recorded = json.loads(entry.repro_file.read_text())["environment"]["flashinfer"]
        assert recorded in entry.versions("flashinfer"), entry.name


def test_a_legacy_range_entry_is_refused_with_the_way_to_rewrite_it(tmp_path: Path) -> None:
    file = tmp_path / "x.json"
    file.write_text(
        json.dumps(
            {
                "format": "difftest-corpus/1",
                "repro": "x.repro.json",
                "expect": {"flashinfer": {">=0.6.16,<0.6.17": "still_fails"}},
            }
        )
    )
    with pytest.raises(FormatError, match="no longer read: rewrite it as 'difftest-corpus/2'"):
        load_entry(file)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"format": "difftest-corpus/0"}, "unknown corpus format"),
        ({"repro": "../x.json"}, "file name next to the entry"),
        ({"expect": {}}, "non-empty"),
        ({"expect": {"*": "broken"}}, "outcomes must be in"),
        ({"expect": {"flashinfer": "fixed"}}, "must map the versions it was run on"),
        ({"expect": {"flashinfer": {">=0.6": "fixed"}}}, "ranges are not facts"),
        ({"expect": {"flashinfer": {"0.7.4": "crash"}}}, "outcomes must be in"),
        ({"expect": {"*": "fixed", "torch": {"2.1": "fixed"}}}, "stands alone"),
    ],
)
def test_malformed_entries_are_format_errors(
    tmp_path: Path, body: dict[str, object], message: str
) -> None:
    data: dict[str, object] = {
        "format": "difftest-corpus/2",
        "repro": "x.repro.json",
        "expect": {"*": "fixed"},
    }
    data.update(body)
    file = tmp_path / "x.json"
    file.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=message):
        load_entry(file)
