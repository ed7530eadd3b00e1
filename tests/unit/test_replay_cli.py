"""``difftest replay``: verdicts per file, exit codes, bad input on one line, pending repros."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _planted import (  # noqa: F401
    PLANTED_FILE,
    corpus_repro,
    cpu_session,
    difftest,
    one_torch_thread,
    planted_fixture,
)

from difftest.interfaces.cli import main
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.records.replay import Verdict, replay_repro
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.records.schemas import load_schema, validate

PLUGIN = ("--plugin", str(PLANTED_FILE))


def one_line_error(proc: object, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr  # type: ignore[attr-defined]
    stderr: str = proc.stderr  # type: ignore[attr-defined]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0]


def test_a_truncated_file_exits_2_with_one_line(tmp_path: Path) -> None:
    good = corpus_repro("planted-page-stride", tmp_path)
    text = good.read_text()
    bad = tmp_path / "truncated.json"
    bad.write_text(text[: len(text) // 2])
    one_line_error(difftest("replay", str(bad), cwd=tmp_path), "truncated.json", "not valid JSON")


def test_a_wrong_schema_version_exits_2_naming_both_versions(tmp_path: Path) -> None:
    bad = corpus_repro("planted-page-stride", tmp_path, format="difftest-repro/9")
    proc = difftest("replay", str(bad), cwd=tmp_path)
    one_line_error(proc, "'difftest-repro/9'", "'difftest-repro/1'")


def test_an_unknown_path_exits_2_naming_it(tmp_path: Path) -> None:
    data = json.loads(corpus_repro("planted-page-stride", tmp_path).read_text())
    data["finding"]["path"] = "no-such-kernel"
    data["plugins"] = []
    bad = tmp_path / "unknown.json"
    bad.write_text(json.dumps(data))
    one_line_error(
        difftest("replay", str(bad), cwd=tmp_path), "path(s) no-such-kernel not registered here"
    )


def test_a_fresh_process_reproduces_the_finding_bit_for_bit(tmp_path: Path) -> None:
    file = corpus_repro("planted-page-stride", tmp_path)
    out = tmp_path / "out.json"
    proc = difftest("replay", str(file), *PLUGIN, "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip().splitlines() == [
        f"{file}: still fails: planted-page-stride: WRONG (tolerance) vs oracle: "
        f"{load_repro(file).finding.reason} [metrics identical bit for bit]"  # type: ignore[union-attr]
    ]
    [row] = json.loads(out.read_text())["outcomes"]
    assert (row["verdict"], row["same_metrics"]) == ("still_fails", True)
    assert row["observed"] == row["expected"]


def test_a_pending_repro_of_a_running_case_replays(tmp_path: Path, planted: ModuleType) -> None:
    # What the campaign writes before running a case (write-ahead): no finding yet.
    case = load_repro(corpus_repro("planted-page-stride", tmp_path)).case
    pending = write_repro(
        tmp_path / "running",
        Repro(
            case=case,
            status="running",
            paths=("torch-sdpa", planted.PAGE_STRIDE),
            plugins=(str(PLANTED_FILE),),
        ),
    )
    assert validate(json.loads(pending.read_text()), load_schema("repro")) == []
    proc = difftest("replay", str(pending), *PLUGIN, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"{pending}: passes: torch-sdpa: agrees"
    assert lines[1].startswith(f"{pending}: fails: planted-page-stride: WRONG (tolerance)")

    agreeing = write_repro(
        tmp_path / "ok", Repro(case=case, status="running", paths=("torch-sdpa",))
    )
    assert main(["replay", *PLUGIN, str(agreeing)]) == 0


def test_other_paths_replay_and_a_missing_gpu_is_said_per_path(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-page-stride", tmp_path)
    code = main(
        ["replay", *PLUGIN, str(file), "--paths", "torch-sdpa,fi-decode-xqa", "--device", "cpu"]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert lines == [
        f"{file}: agrees: torch-sdpa: agrees (as recorded)",
        f"{file}: path fi-decode-xqa not available here: needs a CUDA GPU (device is cpu)",
    ]


def test_a_repro_no_path_of_which_can_run_here_is_a_setup_error(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "xqa.json"
    shutil.copy(
        Path(__file__).resolve().parents[2] / "difftest/corpus/xqa-bmm2-scale-ignored.repro.json",
        file,
    )
    good = corpus_repro("planted-fixed", tmp_path)
    code = main(["replay", *PLUGIN, str(file), str(good), "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == f"difftest: error: {file}: none of its paths can run here\n"
    assert captured.out.splitlines() == [
        f"{file}: path fi-decode-xqa not available here: needs a CUDA GPU (device is cpu)",
        f"{good}: fixed: planted-fixed: agrees (was WRONG)",
    ]


def test_a_bad_file_among_good_ones_still_replays_the_rest(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    good = corpus_repro("planted-fixed", tmp_path)
    missing = tmp_path / "missing.json"
    assert main(["replay", *PLUGIN, str(missing), str(good)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"difftest: error: {missing}: no such file"
    assert captured.out.strip() == f"{good}: fixed: planted-fixed: agrees (was WRONG)"


def test_fails_differently_says_how(tmp_path: Path, planted: ModuleType) -> None:
    def nan_kernel(batch: object) -> torch.Tensor:
        out = planted.run_correct(batch)
        out[0, 0, 0] = float("nan")
        return out

    planted.register_planted(planted.PAGE_STRIDE, nan_kernel, "now NaN")
    file = corpus_repro("planted-page-stride", tmp_path)
    with cpu_session((planted.PAGE_STRIDE,)) as session:
        [outcome] = replay_repro(load_repro(file), session, source="f")
    assert outcome.verdict is Verdict.FAILS_DIFFERENTLY
    assert outcome.detail.startswith("now NONFINITE vs oracle: 1 non-finite outputs (was ")
    assert outcome.verdict.failing


def test_sanitize_says_what_it_could_do_in_one_line(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-fixed", tmp_path)
    out = tmp_path / "o.json"
    assert main(["replay", *PLUGIN, str(file), "--sanitize", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("fixed: planted-fixed: agrees (was WRONG)")
    assert lines[1].startswith(f"{file}: sanitize")
    rows = json.loads(out.read_text())["outcomes"]
    assert rows[0]["verdict"] == "fixed"


def test_replay_of_a_hand_made_case_without_a_result_compares_signatures_only(
    tmp_path: Path, planted: ModuleType
) -> None:
    case = Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(3, 9), q_len=3),
    )
    from difftest.model.outcome import Finding, Outcome

    repro = Repro(
        case=case,
        status="finding",
        paths=(planted.PAGE_STRIDE,),
        finding=Finding(path=planted.PAGE_STRIDE, kind=Outcome.WRONG),
    )
    with cpu_session((planted.PAGE_STRIDE,)) as session:
        [outcome] = replay_repro(repro, session)
    assert outcome.verdict is Verdict.STILL_FAILS
    assert outcome.same_metrics is None
