"""``difftest shrink FILE``: an unshrunk finding, a pending repro, and one that no longer fails."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from _planted import (  # noqa: F401
    PLANTED_FILE,
    campaign,
    corpus_repro,
    one_torch_thread,
    planted_fixture,
)

from difftest.interfaces.cli import main
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.records.schemas import load_schema, validate

PLUGIN = ["--plugin", str(PLANTED_FILE)]
ROOT = Path(__file__).resolve().parents[2]
CORPUS_REPRO = Path("tests") / "corpus" / "planted-window.repro.json"


def unshrunk_finding(out: Path, path: str) -> Path:
    """The first finding of a seed-0 campaign, written without shrinking."""
    report = campaign(out, (path,), max_cases=12, shrink=False)
    assert report.groups, "the seed-0 campaign finds the planted bug in 12 cases"
    return Path(report.groups[0].minimal or "")


def test_shrink_says_the_trigger_a_campaign_finds(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trigger the command prints is the one a campaign's shrink and ablation establish
    for the same bug (two requests, a prefix past the first page), in words and labels."""
    shrunk = campaign(tmp_path / "shrunk", (planted.PAGE_STRIDE,), max_cases=12, shrink=True)
    [group] = [g for g in shrunk.groups if g.established]
    assert group.trigger, "the campaign's group has a trigger to compare with"
    big = unshrunk_finding(tmp_path / "campaign", planted.PAGE_STRIDE)
    capsys.readouterr()
    assert main(["shrink", *PLUGIN, str(big), "--out", str(tmp_path / "small")]) == 1
    needs = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  needs: ")]
    assert needs == [f"  needs: {group.trigger_words} (trigger: {', '.join(group.trigger)})"]


def test_shrink_writes_the_minimal_repro(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    big = unshrunk_finding(tmp_path / "campaign", planted.PAGE_STRIDE)
    original = load_repro(big).case
    assert main(["shrink", *PLUGIN, str(big), "--out", str(tmp_path / "small")]) == 1
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0] == f"{big}: shrinking planted-page-stride WRONG ..."
    # progress on stderr: the first candidate is always shown, with the size it started from
    progress = captured.err.strip().splitlines()
    assert progress and progress[0].split("] ", 1)[1].startswith("shrink runs ")
    assert f"| size {original.size()} -> " in progress[0]
    assert lines[1].startswith(
        f"{big}: shrunk planted-page-stride WRONG: size {original.size()} -> "
    )
    [file] = (tmp_path / "small").glob("*.json")
    assert lines[-1] == f"  repro: {file}"
    assert validate(json.loads(file.read_text()), load_schema("repro")) == []
    small = load_repro(file)
    ps = small.case.attention.page_size
    assert small.case.batch == BatchSpec(
        mode=small.case.batch.mode, prefix_lens=(0, ps + 1), q_len=2
    )
    assert small.shrink is not None and small.shrink.original_digest == original.digest()
    assert small.plugins == (str(PLANTED_FILE),)


def test_a_pending_repro_is_run_first_then_shrunk(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    case = load_repro(unshrunk_finding(tmp_path / "c", planted.PAGE_STRIDE)).case
    pending = write_repro(
        tmp_path / "running",
        Repro(case=case, status="running", paths=("torch-sdpa", planted.PAGE_STRIDE)),
    )
    assert main(["shrink", *PLUGIN, str(pending), "--out", str(tmp_path / "s")]) == 1
    [file] = (tmp_path / "s").glob("*.json")
    repro = load_repro(file)
    assert repro.finding is not None and repro.finding.path == planted.PAGE_STRIDE
    assert len(repro.case.batch.prefix_lens) == 2


def test_a_repro_that_no_longer_fails_is_left_alone(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-fixed", tmp_path)
    assert main(["shrink", *PLUGIN, str(file), "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert (
        "the original did not reproduce: planted-fixed WRONG (tolerance) vs oracle first, " in out
    )
    assert "planted-fixed AGREE on the rerun" in out
    assert not (tmp_path / "s").exists()


def test_a_finding_whose_path_cannot_run_here_is_a_setup_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without the failing path every candidate would "pass": shrinking would report a
    # non-reproduction and exit 0, as if the bug were gone.
    file = tmp_path / "xqa.json"
    corpus = Path(__file__).resolve().parents[2] / "difftest" / "corpus"
    file.write_text((corpus / "xqa-bmm2-scale-ignored.repro.json").read_text())
    code = main(["shrink", *PLUGIN, str(file), "--device", "cpu", "--out", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == (
        f"difftest: error: {file}: path fi-decode-xqa cannot run here: "
        "needs a CUDA GPU (device is cpu)\n"
    )
    assert captured.out == ""
    assert not (tmp_path / "s").exists()


TWO_BUGS = ROOT / "tests" / "fixtures" / "two_bugs.py"


def _bmm2_corpus(folder: Path) -> Path:
    """A corpus that declares ``planted-stride-bmm2``'s bmm2 bug known (trigger bmm2_scale)."""
    folder.mkdir()
    (folder / "bmm2.repro.json").write_text((ROOT / CORPUS_REPRO).read_text())
    entry = {
        "format": "difftest-corpus/2",
        "repro": "bmm2.repro.json",
        "description": "planted: bmm2_scale never applied",
        "expect": {"*": "still_fails"},
        "known": {
            "path": "planted-stride-bmm2",
            "kind": "WRONG",
            "detail": "tolerance",
            "trigger": ["bmm2_scale"],
        },
    }
    (folder / "bmm2.json").write_text(json.dumps(entry))
    return folder


def _two_bug_repro(folder: Path, prefixes: tuple[int, ...]) -> Path:
    case = Case(
        attention=AttentionConfig(
            num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4, v_scale=2.0
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=prefixes, q_len=2),
    )
    return write_repro(folder, Repro(case=case, status="running", paths=("planted-stride-bmm2",)))


def _shrunk(out: Path) -> Case:
    [file] = out.glob("*.json")
    return load_repro(file).case


def test_shrink_does_not_slide_into_a_known_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case that fails through two bugs of one signature, one of them known: the shrink
    keeps the other (dropping a request would leave only the known bug failing it), as a
    campaign's does; without the guard it slides into the known bug."""
    pending = _two_bug_repro(tmp_path / "r", (5, 9))
    corpus = _bmm2_corpus(tmp_path / "corpus")
    plugin = ["--plugin", str(TWO_BUGS)]
    guarded = ["--corpus", str(corpus), "--out", str(tmp_path / "guarded")]
    assert main(["shrink", *plugin, str(pending), *guarded]) == 1
    kept = _shrunk(tmp_path / "guarded")
    assert len(kept.batch.prefix_lens) == 2 and kept.attention.bmm2_scale == 1.0
    needs = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  needs: ")]
    assert needs and "(trigger: L>1, prefix>1, requests>1)" in needs[0]

    unguarded = ["--no-known", "--out", str(tmp_path / "slid")]
    assert main(["shrink", *plugin, str(pending), *unguarded]) == 1
    slid = _shrunk(tmp_path / "slid")
    assert len(slid.batch.prefix_lens) == 1 and slid.attention.bmm2_scale == 2.0


def test_a_known_bugs_own_repro_is_shrunk_as_that_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pending = _two_bug_repro(tmp_path / "r", (0,))  # one request: only the bmm2 bug fails it
    corpus = _bmm2_corpus(tmp_path / "corpus")
    args = ["--corpus", str(corpus), "--out", str(tmp_path / "s")]
    assert main(["shrink", "--plugin", str(TWO_BUGS), str(pending), *args]) == 1
    out = capsys.readouterr().out
    assert f"{pending}: known bug bmm2: shrunk as that bug" in out
    assert "(trigger: bmm2_scale)" in out
    assert _shrunk(tmp_path / "s").attention.bmm2_scale == 2.0
