"""``difftest bench`` on the CPU: its figures, its JSON, and a clear failure when no chosen path
can run here (never a silent report of 0 cases)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from difftest.interfaces.cli import main
from difftest.interfaces.commands.bench import shared_device_note
from difftest.paths import unregister


def test_bench_reports_each_path_the_headline_and_the_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "bench.json"
    code = main(
        [
            "bench", "--device", "cpu", "--paths", "torch-sdpa,torch-paged-online",
            "--max-cases", "12", "--budget-s", "60", "--isolation", "none",
            "--out", str(tmp_path / "o"), "--json", str(report),
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("12 cases, ")
    assert "kernel time / (wall - compile): " in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("torch-")}
    assert set(rows) == {"torch-sdpa", "torch-paged-online"}
    assert all(row[1] == "12" for row in rows.values())  # every case ran on both paths
    data = json.loads(report.read_text())
    assert data["cases"] == 12
    assert 0.0 < data["kernel_share"] <= 1.0
    assert data["timings"]["kernels"] > 0 and data["timings"]["oracle"] > 0
    assert data["kernel_time_shared"] is False and "share the device" not in out


def test_bench_with_no_path_that_runs_here_exits_2_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bench", "--device", "cpu", "--paths", "fi-decode-xqa", "--budget-s", "5",
            "--out", str(tmp_path / "o"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "fi-decode-xqa: needs a CUDA GPU" in err
    assert "no_case_ran" in err


def test_bench_avoids_the_known_bugs_triggers_as_a_campaign_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cases bench draws ahead (for its warmup) avoid the corpus's known triggers from the
    first case, as ``difftest run`` does: a known bug that fires on most cases would otherwise
    spend the bench on rechecking its findings, a cost no campaign has."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(root / "tests" / "corpus" / "planted-window.repro.json", corpus)
    entry = json.loads((root / "tests" / "corpus" / "planted-window.json").read_text())
    entry["known"] = {
        "path": "planted-window", "kind": "WRONG", "detail": "tolerance", "trigger": ["window"]
    }  # fmt: skip
    (corpus / "planted-window.json").write_text(json.dumps(entry))
    runs = {}
    for name, extra in (("avoid", []), ("no-avoid", ["--no-avoid"])):
        report = tmp_path / f"{name}.json"
        main(
            [
                "bench", "--device", "cpu", "--plugin", str(root / "tests/fixtures/planted.py"),
                "--paths", "planted-window", "--corpus", str(corpus), "--max-cases", "80",
                "--budget-s", "15", "--isolation", "none",
                "--out", str(tmp_path / name), "--json", str(report), *extra,
            ]
        )  # fmt: skip
        runs[name] = json.loads(report.read_text())
    capsys.readouterr()
    (avoided,) = runs["avoid"]["avoidance"]
    assert avoided["trigger"] == ["window"] and avoided["avoided"] > 0
    assert runs["no-avoid"]["avoidance"] == []

    def found(data: dict[str, object]) -> int:
        return sum(g["count"] for g in data["groups"])  # type: ignore[index, misc, union-attr]

    assert found(runs["avoid"]) < found(runs["no-avoid"])


def test_a_warmup_in_processes_builds_the_variants_findings_are_rechecked_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--warmup-processes``, bench's warmup also builds the variants a known bug's
    findings would be rechecked on (``Triage.resets_of``), one case per compile variant, so a
    recheck in the measured campaign does not build a module."""
    import dataclasses

    from difftest.interfaces.commands import bench
    from difftest.model.case import Case

    asked: list[list[Case]] = []

    def warm(cases, paths, device, processes, plugins):  # type: ignore[no-untyped-def]
        asked.append(list(cases))
        return []

    class Resets:
        def __init__(self, known: object) -> None:
            pass

        def resets_of(self, case: Case, paths: object) -> list[Case]:  # two variants each
            a = case.attention
            return [
                case.replace(attention=dataclasses.replace(a, head_dim=64)),
                case.replace(attention=dataclasses.replace(a, head_dim=256), seed=case.seed + 1),
            ]

    monkeypatch.setattr(bench, "warm_up_in_processes", warm)
    monkeypatch.setattr(bench, "Triage", Resets)
    code = main(
        [
            "bench", "--device", "cpu", "--paths", "torch-sdpa", "--max-cases", "6",
            "--budget-s", "60", "--isolation", "none", "--warmup-processes", "2",
            "--out", str(tmp_path / "o"),
        ]
    )  # fmt: skip
    assert code == 0
    (cases,) = asked
    planned, extra = cases[:6], cases[6:]
    expected = {
        c.replace(attention=dataclasses.replace(c.attention, head_dim=d)).compile_variant()
        for c in planned
        for d in (64, 256)
    }
    assert {c.compile_variant() for c in extra} == expected
    assert len(extra) == len(expected)  # one case per variant


def test_the_headline_is_marked_when_workers_share_one_gpu() -> None:
    # several workers on one GPU each time their paths on the host's clock around a device
    # sync, which also counts the others' queued work (docs/validation.md, Run 16)
    note = shared_device_note(4, "cuda")
    assert note is not None and "4 workers share the device" in note and "--workers 1" in note
    assert shared_device_note(1, "cuda") is None  # one worker: the device is its own
    assert shared_device_note(4, "cpu") is None  # a worker per core: no shared device queue


def test_the_headline_is_none_when_compiling_took_the_whole_wall_time() -> None:
    from difftest.interfaces.commands.bench import kernel_share

    assert kernel_share(0.5, 10.0, 5.0) == pytest.approx(0.1)
    assert kernel_share(0.0, 10.0, 0.0) == 0.0
    # several workers' compile waits, summed, past the wall time (Run 30): no figure
    assert kernel_share(0.368, 28.625, 28.823) is None
    assert kernel_share(0.1, 3.0, 3.0) is None


def test_bench_says_how_many_findings_only_a_packed_launch_showed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``launch-slots-8`` is right on the small shape's 4 requests alone and wrong past the
    eighth request of a launch: packed by 4, its findings are all packed-only, and the bench
    says so (and exits 1, as the run does) instead of reporting no finding."""
    plugin = Path(__file__).resolve().parents[1] / "fixtures" / "launch_slots.py"
    try:
        code = main(
            [
                "bench", "--plugin", str(plugin), "--device", "cpu", "--limits", "small",
                "--paths", "launch-slots-8", "--pack", "4", "--max-cases", "16",
                "--budget-s", "60", "--isolation", "none", "--out", str(tmp_path / "o"),
            ]
        )  # fmt: skip
    finally:  # forget the plugin's path and module, so a later load registers it again
        unregister("launch-slots-8")
        for name in [m for m in sys.modules if m.startswith("difftest_plugin_")]:
            del sys.modules[name]
    out = capsys.readouterr().out
    assert code == 1, out
    assert "packed-only findings: " in out and "findings: 0" not in out
    line = next(x for x in out.splitlines() if x.startswith("packed-only findings: "))
    assert int(line.split()[2]) > 0
