"""``difftest explain``: the error map, the visible KV of wrong rows, pages, diagnoses, PNG."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from _planted import PLANTED_FILE, corpus_repro, one_torch_thread, planted_fixture  # noqa: F401

from difftest.interfaces.cli import main
from difftest.interfaces.commands.explain import write_heatmap
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec, TreeDraft
from difftest.model.outcome import ErrorLocation
from difftest.records.repro import Repro, load_repro
from difftest.triage.explain import ErrorMap, error_map
from difftest.triage.location import locate_pages, visible_ranges


def _map_of(repro: Repro, *, rerun: bool = True) -> ErrorMap:
    return error_map(
        repro.case, repro.finding, torch.device("cpu"), recorded=repro.path_result(), rerun=rerun
    )


def test_visible_ranges_follow_position_window_and_draft_mask() -> None:
    case = Case(
        attention=AttentionConfig(
            num_qo_heads=1, num_kv_heads=1, head_dim=16, page_size=4, window_left=5
        ),
        batch=BatchSpec(
            mode="target_verify",
            prefix_lens=(10, 2),
            q_len=4,
            draft=TreeDraft(parents=(-1, 0, 0, 2)),
        ),
    )
    # request 0: prefix 10, rows at positions 10..13; row 3 sees draft tokens 0, 2, 3
    assert visible_ranges(case, 0, 0) == [(5, 10)]
    assert visible_ranges(case, 0, 3) == [(8, 10), (12, 13)]
    # request 1: prefix 2, no window cut; row 1 sees draft tokens 0, 1
    assert visible_ranges(case, 1, 1) == [(0, 3)]
    # pages: request 1's tokens 0..5 live on its own pages, column by column
    shared = case.replace(pool=PoolSpec(page_order="reversed"))
    [located] = locate_pages(
        shared, [ErrorLocation(request=1, rows=(1,), heads=(0,), max_abs=1.0, bound=0.1)]
    )
    assert located.seq_len == 6 and located.prefix_len == 2
    assert located.to_json()["visible"] == {"1": [[0, 3]]}
    n = shared.num_pages()
    # logical pages: request 0 has 4 (0..3), request 1 has 2 (4, 5); reversed order
    assert located.pages == (n - 1 - 4, n - 1 - 5)
    assert located.visible_pages == (n - 1 - 4,)


def test_the_page_stride_map_names_the_wrong_request_row_and_pages(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-page-stride", tmp_path)
    case = load_repro(file).case
    ps = case.attention.page_size
    assert (
        main(
            [
                "explain",
                "--plugin",
                str(PLANTED_FILE),
                str(file),
                "--json",
                str(tmp_path / "map.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "error map from rerun of planted-page-stride on cpu" in out
    assert f"request 1: prefix {ps + 1}, seq_len {ps + 3}" in out
    assert "wrong rows [1], heads [0]" in out
    assert f"row 1 (position {ps + 2}): sees KV 0..{ps + 2} on pages" in out


def test_a_window_bug_is_diagnosed_as_one_key_too_many(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-window", tmp_path)
    emap = _map_of(load_repro(file))
    assert emap.diagnoses == {(0, 0): ["window one key too wide", "no window"]}
    assert main(["explain", "--plugin", str(PLANTED_FILE), str(file)]) == 0
    out = capsys.readouterr().out
    assert "row 0 (position 1): sees KV 1 on pages [0]" in out
    assert "matches the kernel exactly if the row: window one key too wide; no window" in out


def test_without_a_rerun_the_stored_metrics_are_used(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-page-stride", tmp_path)
    repro = load_repro(file)
    emap = _map_of(repro, rerun=False)
    assert emap.source == "stored metrics (--no-rerun)"
    assert emap.err is None and emap.diagnoses is None
    heat = emap.heatmap(repro.case)
    L = repro.case.batch.q_len
    assert heat.shape == (repro.case.batch.num_query_rows, 1)
    assert heat[1 * L + 1, 0] > 1 and heat.count_nonzero() == 1


def test_png_without_matplotlib_is_one_line_exit_2(
    tmp_path: Path,
    planted: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    file = corpus_repro("planted-page-stride", tmp_path)
    assert (
        main(
            ["explain", "--plugin", str(PLANTED_FILE), str(file), "--png", str(tmp_path / "x.png")]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["difftest: error: --png needs matplotlib, which is not installed "
                   "(pip install 'difftest[plot]')"]  # fmt: skip


def test_the_heatmap_plots_error_over_bound_per_row_and_head(
    tmp_path: Path, planted: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, Any] = {}

    class Axes:
        def imshow(self, grid: Any, **kw: Any) -> str:
            calls["grid"] = grid
            return "image"

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: calls.setdefault(name, []).append(a)

    class Figure:
        def colorbar(self, *a: Any, **k: Any) -> None:
            pass

        def savefig(self, file: Path, **k: Any) -> None:
            calls["saved"] = file

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **k: (Figure(), Axes())  # type: ignore[attr-defined]
    pyplot.close = lambda fig: calls.setdefault("closed", 1)  # type: ignore[attr-defined]
    fake = types.ModuleType("matplotlib")
    fake.use = lambda backend: calls.setdefault("backend", backend)  # type: ignore[attr-defined]
    fake.pyplot = pyplot  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    emap = _map_of(repro)
    png = tmp_path / "map.png"
    assert write_heatmap(emap, repro.case, png) == png
    assert calls["saved"] == png and calls["backend"] == "Agg" and calls["closed"] == 1
    grid = calls["grid"]
    assert grid.shape == (4, 1)  # 2 requests x L=2 rows, 1 head
    assert (grid > 1).nonzero()[0].tolist() == [3]  # request 1, row 1 only
    assert calls["axhline"] == [(1.5,)]  # the line between the two requests


def test_a_scale_applied_in_the_wrong_place_is_diagnosed(planted: ModuleType) -> None:
    from difftest.model.outcome import Outcome
    from difftest.records.repro import Finding, Repro

    case = Case(
        attention=AttentionConfig(
            num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=16, v_scale=2.0
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5,), q_len=2),
    )
    repro = Repro(
        case=case,
        status="finding",
        paths=(planted.BMM2,),
        finding=Finding(path=planted.BMM2, kind=Outcome.WRONG),
    )
    emap = _map_of(repro)
    assert emap.diagnoses == {
        (0, 0): ["bmm2_scale (v_scale / o_scale) not applied", "v_scale not applied"],
        (0, 1): ["bmm2_scale (v_scale / o_scale) not applied", "v_scale not applied"],
    }


def test_a_saved_output_gives_the_full_map_where_the_path_cannot_run(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-window", tmp_path, plugins=[])  # nothing to load it again
    assert main(["explain", "--plugin", str(PLANTED_FILE), str(file), "--save-output"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"output stored with {file}")
    repro = load_repro(file)
    assert repro.tensors is not None and repro.tensors.keys == ("bound", "out")
    planted.unregister_all()  # the path is gone: only the stored output can explain it
    assert main(["explain", str(file)]) == 0
    out = capsys.readouterr().out
    assert (
        "error map from the kernel output stored with the repro (path 'planted-window' is " in out
    )
    assert "matches the kernel exactly if the row: window one key too wide; no window" in out
    with_no_rerun = main(
        ["explain", "--plugin", str(PLANTED_FILE), str(file), "--save-output", "--no-rerun"]
    )
    assert with_no_rerun == 2
    assert "--save-output needs a rerun here" in capsys.readouterr().err
