"""Repro files: round trip, derived blocks, safetensors sidecars, one-line load errors, and the
JSON Schema every written repro satisfies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from difftest.judgement.tolerance import Tolerance
from difftest.machine.environment import Environment
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.errors import FormatError
from difftest.model.outcome import CaseResult, ErrorLocation, Finding, Metrics, Outcome, PathResult
from difftest.records.repro import (
    REPRO_FORMAT,
    Repro,
    load_repro,
    load_tensors,
    parse_repro,
    write_repro,
)
from difftest.records.schemas import load_schema, validate

CASE = Case(
    attention=AttentionConfig(num_qo_heads=4, num_kv_heads=2, head_dim=16, page_size=4),
    batch=BatchSpec(mode="target_verify", prefix_lens=(3, 6), q_len=2),
)
ERRORS = (ErrorLocation(request=1, rows=(0, 1), heads=(2,), max_abs=0.5, bound=0.01),)
WRONG = PathResult(
    path="k",
    outcome=Outcome.WRONG,
    reason="1 of 2 requests over tolerance",
    detail="tolerance",
    metrics=Metrics(max_abs=0.5, unwritten_rows=0, nonfinite=0, errors=ERRORS),
)
FINDING = Repro(
    case=CASE,
    status="finding",
    paths=("torch-sdpa", "k"),
    finding=Finding(path="k", kind=Outcome.WRONG, reason=WRONG.reason),
    result=CaseResult(case_digest=CASE.digest(), results=(WRONG,)),
    tolerance=Tolerance(),
    environment=Environment(torch="x"),
    shrink=None,
    plugins=("my.plugin",),
)


def valid(file: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(file.read_text())
    assert validate(data, load_schema("repro")) == [], file
    return data


def test_a_finding_round_trips_with_its_derived_blocks(tmp_path: Path) -> None:
    file = write_repro(tmp_path, FINDING)
    assert file.name == f"{CASE.digest()}-k-wrong.json"
    data = valid(file)
    assert next(iter(data)) == "format" and data["format"] == REPRO_FORMAT
    assert data["signature"] == {
        "path": "k",
        "kind": "WRONG",
        "against": "oracle",
        "detail": "tolerance",
    }
    [where] = data["location"]
    # request 1: prefix 6, T = 8: pages of 4 tokens, logical pages 2, 3 (request 0 has 2)
    assert (where["seq_len"], where["prefix_len"], where["pages"]) == (8, 6, [2, 3])
    assert where["visible"] == {"0": [[0, 6]], "1": [[0, 7]]}
    assert where["visible_pages"] == [2, 3]
    loaded = load_repro(file)
    assert loaded == FINDING.__class__(**{**_fields(FINDING), "created": data["created"]})


def _fields(repro: Repro) -> dict[str, Any]:
    return {n: getattr(repro, n) for n in repro.__dataclass_fields__}


def test_derived_blocks_are_recomputed_not_trusted(tmp_path: Path) -> None:
    data = valid(write_repro(tmp_path, FINDING))
    data["location"] = [{"request": 99}]
    data["signature"]["kind"] = "HANG"
    repro = parse_repro(data, "edited")
    assert repro.to_json()["location"][0]["request"] == 1
    assert repro.signature() is not None and repro.signature().kind is Outcome.WRONG  # type: ignore[union-attr]


def test_a_pending_repro_is_written_and_loads(tmp_path: Path) -> None:
    pending = Repro(case=CASE, status="running", paths=("torch-sdpa",))
    file = write_repro(tmp_path / "running", pending)
    assert file.name == f"{CASE.digest()}.running.json"
    data = valid(file)
    assert data["finding"] is None and data["signature"] is None and data["location"] is None
    assert load_repro(file).case == CASE


def test_tensors_travel_as_a_checked_safetensors_sidecar(tmp_path: Path) -> None:
    tensors = {
        "out": torch.arange(12, dtype=torch.float32).view(3, 4).to(torch.bfloat16),
        "mask": torch.tensor([True, False]),
    }
    file = write_repro(tmp_path, FINDING, tensors=tensors)
    data = valid(file)
    sidecar = tmp_path / data["tensors"]["file"]
    assert sidecar.name == file.name.replace(".json", ".safetensors") and sidecar.is_file()
    assert data["tensors"]["keys"] == ["mask", "out"]
    back = load_tensors(load_repro(file), file)
    assert back.keys() == tensors.keys()
    for key, t in tensors.items():
        assert back[key].dtype == t.dtype and torch.equal(back[key], t)
    raw = sidecar.read_bytes()
    sidecar.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))
    with pytest.raises(FormatError, match="does not match its recorded sha256"):
        load_tensors(load_repro(file), file)
    assert load_tensors(FINDING, file) == {}


@pytest.mark.parametrize(
    "name", ["../x.safetensors", "/tmp/x.safetensors", "x.pt", ".x.safetensors"]
)
def test_a_sidecar_must_be_a_plain_safetensors_name(tmp_path: Path, name: str) -> None:
    data = valid(write_repro(tmp_path, FINDING, tensors={"a": torch.zeros(2)}))
    data["tensors"]["file"] = name
    with pytest.raises(FormatError, match="plain"):
        parse_repro(data, "f")
    assert validate(data, load_schema("repro")) != []


def _edit(change: Any) -> dict[str, Any]:
    data = FINDING.to_json()
    change(data)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        (
            _edit(lambda d: d.update(format="difftest-repro/2")),
            "unknown repro format 'difftest-repro/2'",
        ),
        (_edit(lambda d: d.pop("format")), "unknown repro format None"),
        (_edit(lambda d: d.update(status="done")), "repro.status: must be"),
        (_edit(lambda d: d.update(finding=None)), "no finding"),
        (_edit(lambda d: d["finding"].update(kind="BROKEN")), "finding.kind: unknown outcome"),
        (_edit(lambda d: d.update(paths="k")), "repro.paths: must be a list"),
        (_edit(lambda d: d["case"]["batch"].update(q_len=0)), "q_len"),
        (_edit(lambda d: d["case"].update(format="difftest-case/0")), "unknown case format"),
        (_edit(lambda d: d.update(result=[1])), "repro.result must be a JSON object"),
    ],
)
def test_malformed_repros_are_one_line_format_errors(data: Any, message: str) -> None:
    with pytest.raises(FormatError, match=message) as info:
        parse_repro(data, "file.json")
    assert str(info.value).startswith("file.json: ") and "\n" not in str(info.value)


def test_unreadable_files_are_format_errors(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        load_repro(tmp_path / "missing.json")
    text = json.dumps(FINDING.to_json())
    (tmp_path / "cut.json").write_text(text[:100])
    with pytest.raises(FormatError, match="truncated"):
        load_repro(tmp_path / "cut.json")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda d: d.update(status="done"), "$.status"),
        (lambda d: d.pop("case"), "missing required key 'case'"),
        (lambda d: d.update(extra=1), "unexpected key 'extra'"),
        (lambda d: d["case"]["attention"].update(head_dim="64"), "$.case.attention.head_dim"),
        (lambda d: d["location"][0].update(seq_len=0), "$.location[0].seq_len"),
    ],
)
def test_the_schema_validator_rejects_what_the_schema_forbids(change: Any, problem: str) -> None:
    data = _edit(change)
    errors = validate(data, load_schema("repro"))
    assert errors and any(problem in e for e in errors), errors
