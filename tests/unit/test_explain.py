"""``difftest explain``: the error map, the visible KV of wrong rows, pages, diagnoses, PNG."""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from _planted import (  # noqa: F401
    PLANTED_FILE,
    campaign,
    corpus_repro,
    import_planted,
    one_torch_thread,
    planted_fixture,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest.generation.materialize import materialize
from difftest.generation.modes import Modes
from difftest.generation.strategies import cases
from difftest.interfaces.cli import main
from difftest.interfaces.commands.explain import write_heatmap
from difftest.judgement.tolerance import reference
from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
)
from difftest.model.outcome import ErrorLocation, Finding, Outcome
from difftest.records.repro import Repro, load_repro, write_repro
from difftest.records.run_dir import RunDirectory, repro_of
from difftest.triage.explain import (
    ErrorMap,
    _hypotheses,
    _page_swaps,
    _row_output,
    diagnose_row,
    error_map,
    explain_lines,
)
from difftest.triage.location import (
    locate_pages,
    ranges_of,
    row_visibility,
    rows_ranges,
    visible_positions,
    visible_ranges,
)


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


def _wide_window_bmm2_case() -> Case:
    """A window far wider than any row's position (``pos - W - 1`` is well below 0), one
    key per page, and a wrong ``bmm2_scale``."""
    return Case(
        attention=AttentionConfig(
            num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=1, window_left=10, v_scale=2.0
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=(2,), q_len=2),
    )


def test_a_window_wider_than_the_rows_positions_is_explained(planted: ModuleType) -> None:
    # Before the fix, "window one key too wide" tried key pos - W - 1 = -9 and the row's
    # output indexed page -9: IndexError.
    repro = Repro(
        case=_wide_window_bmm2_case(),
        status="finding",
        paths=(planted.BMM2,),
        finding=Finding(path=planted.BMM2, kind=Outcome.WRONG),
    )
    emap = _map_of(repro)
    expected = ["bmm2_scale (v_scale / o_scale) not applied", "v_scale not applied"]
    assert emap.diagnoses == {(0, 0): expected, (0, 1): expected}


def _window_case(window_left: int, prefix: int, q_len: int, **batch: Any) -> Case:
    return Case(
        attention=AttentionConfig(
            num_qo_heads=1, num_kv_heads=1, head_dim=4, page_size=2, window_left=window_left
        ),
        batch=BatchSpec(mode="target_verify", prefix_lens=(prefix,), q_len=q_len, **batch),
    )


WINDOW_MISTAKES = (
    "window one key too wide",
    "window one key too narrow",
    "window measured from the request's last position",
    "no window",
)


def _window_hypotheses(case: Case, request: int, row: int) -> dict[str, list[int]]:
    return {k: v for k, v in _hypotheses(case, request, row).items() if k in WINDOW_MISTAKES}


def test_a_zero_width_window_narrowed_by_one_sees_nothing() -> None:
    case = _window_case(0, prefix=0, q_len=2)
    # row 0 is at position 0: nothing left of it to widen to, nothing a missing window adds
    assert visible_positions(case, 0, 0) == [0]
    assert _window_hypotheses(case, 0, 0) == {
        "window one key too narrow": [],
        "window measured from the request's last position": [],
    }
    # row 1 (position 1, the last row): the window from the last position is its own
    assert _window_hypotheses(case, 0, 1) == {
        "window one key too wide": [0, 1],
        "window one key too narrow": [],
        "no window": [0, 1],
    }


def test_a_window_edge_at_key_0_has_no_key_to_its_left() -> None:
    case = _window_case(3, prefix=3, q_len=2)  # row 0 at position 3 sees 0..3
    assert visible_positions(case, 0, 0) == [0, 1, 2, 3]
    assert _window_hypotheses(case, 0, 0) == {
        "window one key too narrow": [1, 2, 3],
        "window measured from the request's last position": [1, 2, 3],
    }
    assert _window_hypotheses(case, 0, 1) == {  # position 4 sees 1..4
        "window one key too wide": [0, 1, 2, 3, 4],
        "window one key too narrow": [2, 3, 4],
        "no window": [0, 1, 2, 3, 4],
    }


@pytest.mark.parametrize("window_left", [5, 6, 100])
def test_a_window_at_least_as_wide_as_the_sequence_is_no_mistake_to_make(
    window_left: int,
) -> None:
    case = _window_case(window_left, prefix=2, q_len=3)  # positions 2..4, seq_len 5
    for row in range(3):
        assert visible_positions(case, 0, row) == list(range(row + 3))
        assert _window_hypotheses(case, 0, row) == {}


def test_a_window_edge_on_a_draft_token_the_mask_hides_is_no_narrower() -> None:
    case = _window_case(1, prefix=2, q_len=3, draft=TreeDraft(parents=(-1, 0, 0)))
    # row 2 (position 4) sees draft tokens 0 and 2: position 3 (token 1) is masked, so the
    # window's edge (4 - 1 = 3) cuts nothing it could see, and one key wider adds token 0
    assert visible_positions(case, 0, 2) == [4]
    assert _window_hypotheses(case, 0, 2) == {
        "window one key too wide": [2, 4],
        "no window": [0, 1, 2, 4],
    }
    assert _hypotheses(case, 0, 2)["draft mask ignored (plain causal)"] == [3, 4]


def _cases_of_every_feature() -> Iterator[Case]:
    """Small cases with windows (none, 0, narrower and wider than the rows' positions), chain
    and tree drafts, GQA, sinks, fp8 caches with scales, CUDA-graph padding requests and
    data-parallel padding rows."""
    for window_left in (-1, 0, 1, 2, 3, 9):
        for draft in (CausalDraft(), TreeDraft(parents=(-1, 0, 0))):
            for sinks, kv in ((False, "bf16"), (True, "fp8_e4m3")):
                yield Case(
                    attention=AttentionConfig(
                        num_qo_heads=4,
                        num_kv_heads=2,
                        head_dim=4,
                        page_size=2,
                        window_left=window_left,
                        sinks=sinks,
                        kv_dtype=kv,  # type: ignore[arg-type]
                        k_scale=0.5 if sinks else 1.0,
                        v_scale=2.0 if sinks else 1.0,
                    ),
                    batch=BatchSpec(
                        mode="target_verify",
                        prefix_lens=(0, 1, 4),
                        q_len=3,
                        draft=draft,
                        padding_requests=1,
                        padding_rows=2,
                    ),
                    pool=PoolSpec(page_order="reversed"),
                )


def test_every_hypothesis_stays_inside_the_request_and_the_rows_match_the_oracle() -> None:
    for case in _cases_of_every_feature():
        batch = materialize(case)
        ref = reference(batch)
        L = case.batch.q_len
        for b, seq in enumerate(case.batch.seq_lens()):  # the padding request included
            pages = [int(p) for p in batch.block_tables[b, : case.pages_per_request()[b]]]
            for row in range(L):
                truth = visible_positions(case, b, row)
                assert truth and truth == sorted(set(truth)) and truth[-1] == seq - L + row
                for name, keys in _hypotheses(case, b, row).items():
                    assert keys == sorted(set(keys)), (case, b, row, name)
                    assert all(0 <= k < seq for k in keys), (case, b, row, name, keys)
                    assert keys != truth
                # explain's row over the visible keys is the oracle's row
                mine = _row_output(batch, b, row, truth, pages)
                torch.testing.assert_close(mine, ref[b * L + row], rtol=0, atol=1e-12)
                # every trial runs (empty key sets included); the oracle's own row matches
                # no mistake that changes it
                diagnose_row(batch, ref, b, row, 0.0)


def test_a_row_that_sees_nothing_is_the_oracle_s_empty_row() -> None:
    case = next(c for c in _cases_of_every_feature() if c.attention.sinks)
    batch = materialize(case)
    pages = [int(p) for p in batch.block_tables[0, : case.pages_per_request()[0]]]
    empty = _row_output(batch, 0, 0, [], pages)
    assert empty.shape == (4, 4) and bool((empty == 0).all())
    with pytest.raises(ValueError, match="seq_len 3"):
        _row_output(batch, 0, 0, [-1, 0], pages)
    with pytest.raises(ValueError, match="seq_len 3"):
        _row_output(batch, 0, 0, [0, 3], pages)


def test_a_recorded_plugin_is_never_imported_only_one_given_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "imported"
    plugin = tmp_path / "explain_plugin.py"  # the planted paths, and a trace of its import
    plugin.write_text(
        PLANTED_FILE.read_text() + f"\nfrom pathlib import Path\nPath({str(marker)!r}).touch()\n"
    )
    import_planted().unregister_all()  # not registered until a plugin registers them
    file = corpus_repro("planted-window", tmp_path, plugins=[str(plugin)])
    try:
        assert main(["explain", str(file)]) == 2
        err = capsys.readouterr().err
        assert f"not registered here; the repro was written with plugin(s) {plugin}" in err
        assert not marker.exists()
        assert main(["explain", "--plugin", str(plugin), "--isolation", "none", str(file)]) == 0
        assert marker.exists()
        assert "window one key too wide" in capsys.readouterr().out
    finally:
        import_planted().unregister_all()


MUTANTS_PLUGIN = "difftest.calibration.mutants"
CAMPAIGN_PATHS = (
    "planted-window",
    "mutant-window-edge-exclusive",
    "mutant-window-from-last-row",
    "mutant-sinks-ignored",
    "mutant-draft-mask-ignored",
    "mutant-partial-last-page",
    "mutant-padded-rows-as-requests",
    "mutant-fp8-scale-twice",
    "mutant-gqa-modulo",
    "mutant-row-stride",
)
WINDOW_DIAGNOSES = {
    "planted-window": "window one key too wide",
    "mutant-window-edge-exclusive": "window one key too narrow",
    "mutant-window-from-last-row": "window measured from the request's last position",
    "mutant-draft-mask-ignored": "draft mask ignored (plain causal)",
}
"""The visibility mutants, and the diagnosis each of their wrong rows must get."""


def _features(case: Case) -> set[str]:
    a, b = case.attention, case.batch
    named = {
        "window": a.window_left >= 0,
        "sinks": a.sinks,
        "tree": b.draft.kind == "tree",
        "fp8": a.kv_dtype == "fp8_e4m3",
        "gqa": a.group_size > 1,
        "padding requests": b.padding_requests > 0,
        "padding rows": b.padding_rows > 0,
    }
    return {name for name, present in named.items() if present}


@pytest.mark.slow
def test_explain_succeeds_on_every_finding_of_a_campaign_with_windows(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "campaign"
    plugins = (str(PLANTED_FILE), MUTANTS_PLUGIN)
    campaign(
        out, CAMPAIGN_PATHS, groups=99, max_cases=20, plugins=plugins, shrink=False
    )  # 99 groups: never reached, every case runs
    findings = list(RunDirectory(out).findings())
    # a corpus of real findings of every kind and feature
    assert {f.result.path for f in findings} == set(CAMPAIGN_PATHS)
    assert {f.result.outcome for f in findings} == {Outcome.WRONG, Outcome.RAISED}
    features = Counter(x for f in findings for x in _features(f.case))
    assert set(features) == {
        "window", "sinks", "tree", "fp8", "gqa", "padding requests", "padding rows"
    }  # fmt: skip
    assert any(
        f.case.attention.window_left > f.case.batch.q_len + min(f.case.batch.prefix_lens)
        for f in findings
    ), "a window wider than some row's position"
    cpu = torch.device("cpu")
    diagnosed = Counter[str]()
    for f in findings:
        repro = repro_of(f, CAMPAIGN_PATHS)
        for rerun in (True, False):
            emap = error_map(
                repro.case, repro.finding, cpu, recorded=repro.path_result(), rerun=rerun
            )
            lines = explain_lines(repro.case, repro.finding, emap)
            assert lines[0].startswith(f"{f.result.path} {f.result.outcome.value}")
            if f.result.outcome is Outcome.WRONG:
                assert emap.errors, (f.digest, f.result.path, rerun)
                assert emap.heatmap(repro.case).max() > 1
            if not rerun:
                assert emap.source == "stored metrics (--no-rerun)"
            elif f.result.outcome is Outcome.WRONG:
                assert emap.source == f"rerun of {f.result.path} on cpu"
                assert emap.diagnoses, (f.digest, f.result.path)
                if f.result.path in WINDOW_DIAGNOSES:
                    for (b, row), names in emap.diagnoses.items():
                        assert WINDOW_DIAGNOSES[f.result.path] in names, (f.digest, b, row)
                        diagnosed[f.result.path] += 1
    assert set(diagnosed) == set(WINDOW_DIAGNOSES)
    # the command, with the plugins given on its command line: one finding of each path
    first = {f.result.path: f for f in reversed(findings)}
    for path, f in sorted(first.items()):
        file = write_repro(tmp_path / "repros", repro_of(f, CAMPAIGN_PATHS))
        for extra in ([], ["--no-rerun"]):
            args = ["explain", "--plugin", plugins[0], "--plugin", plugins[1], str(file)]
            assert main([*args, "--isolation", "none", *extra]) == 0, (path, extra)
            text = capsys.readouterr().out
            assert text.startswith(f"{path} {f.result.outcome.value}")
            assert ("stored metrics (--no-rerun)" in text) == bool(extra)


def _located_by_positions(case: Case, errors: list[ErrorLocation]) -> list[dict[str, object]]:
    """What :func:`locate_pages` gives, spelled out position by position: each row's visible
    positions cut into runs, each run's page columns, the pages in order of first sight."""
    from difftest.triage.location import MAX_LISTED_PAGES, page_table

    table, ps = page_table(case), case.attention.page_size
    out = []
    for err in errors:
        b, visible, seen = err.request, {}, []
        for r in err.rows:
            runs: list[tuple[int, int]] = []
            for k in visible_positions(case, b, r):
                if runs and runs[-1][1] == k - 1:
                    runs[-1] = (runs[-1][0], k)
                else:
                    runs.append((k, k))
            visible[r] = runs
            cols: list[int] = []
            for first, last in runs:
                cols += [c for c in range(first // ps, last // ps + 1) if c not in cols]
            seen += [int(table[b, c]) for c in sorted(cols) if int(table[b, c]) not in seen]
        used = case.pages_per_request()[b]
        pages = [int(p) for p in table[b, :used]]
        out.append(
            {
                "visible": visible,
                "pages": tuple(pages[:MAX_LISTED_PAGES]),
                "visible_pages": tuple(seen[:MAX_LISTED_PAGES]),
                "pages_truncated": max(len(pages), len(seen)) > MAX_LISTED_PAGES,
            }
        )
    return out


def test_located_pages_are_the_position_by_position_definition_on_planned_cases() -> None:
    """:func:`locate_pages` works on runs of positions and sets of page columns (a repro of a
    case with 13,000-token prefixes took 0.4 s to write with per-position lists); on the first
    planned CPU and GPU-limit cases, every request and row, it gives what the definition gives."""
    import itertools

    from difftest.campaign.planning import CampaignConfig, Planner
    from difftest.generation.strategies import CPU_LIMITS, GPU_LIMITS

    checked = 0
    for limits in (CPU_LIMITS, GPU_LIMITS):
        config = CampaignConfig(seed=5, limits=limits)
        for _, case in itertools.islice(Planner(config, torch.device("cpu")), 12):
            errors = [
                ErrorLocation(request=b, rows=tuple(range(n)), heads=(0,), max_abs=1.0, bound=0.5)
                for b, n in enumerate(case.batch.new_tokens())
            ][:6]
            got = [
                {
                    "visible": x.visible,
                    "pages": x.pages,
                    "visible_pages": x.visible_pages,
                    "pages_truncated": x.pages_truncated,
                }
                for x in locate_pages(case, errors)
            ]
            assert got == _located_by_positions(case, errors)
            checked += 1
    assert checked == 24


def test_a_mistake_that_only_nudges_a_row_barely_over_its_bound_explains_nothing() -> None:
    """A row whose error is just over its bound: a page swap that moves the row a hair toward
    the kernel's output leaves it within the bound, but explains almost none of the error, so
    it is no diagnosis (as a GPU finding's explain once claimed of many page swaps). The same
    swap made exactly is one."""
    case = Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=8, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(11,), q_len=2),
    )
    batch = materialize(case)
    ref = reference(batch).double()
    row = 1  # the second of L = 2 rows: it sees the whole prefix
    pages = [int(p) for p in batch.block_tables[0, : case.pages_per_request()[0]]]
    truth = visible_positions(case, 0, row)
    swaps = _page_swaps(case, pages, truth)
    shifts = {n: _row_output(batch, 0, row, truth, p) - ref[row] for n, p in swaps.items()}
    name, shift = max(shifts.items(), key=lambda kv: float(kv[1].max()))
    assert float(shift.max()) > 0
    bound = 10 * max(float(s.abs().max()) for s in shifts.values())
    at = divmod(int(shift.argmax()), case.attention.head_dim)
    nudged = ref.clone()
    nudged[row][at] += bound + 0.5 * float(shift[at])  # just over the bound
    assert float((nudged[row] - ref[row]).abs().max()) > bound
    assert float((nudged[row] - (ref[row] + shift)).abs().max()) <= bound  # the old test
    assert diagnose_row(batch, nudged, 0, row, bound) == []

    made = ref.clone()
    made[row] = ref[row] + shift
    assert name in diagnose_row(batch, made, 0, row, float(shift.abs().max()) / 2)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=cases(modes=Modes(ragged=True)) | cases(),
    pick=st.randoms(use_true_random=False),
)
def test_visible_ranges_from_the_lengths_are_the_masks(case: Case, pick: Any) -> None:
    """The location's ranges, worked out per row from the lengths (what a repro's location
    uses), are the runs of the oracle's visibility mask of that row: every mode, window,
    draft tree and ragged request the generators make."""
    for request in sorted(
        pick.sample(range(case.batch.num_requests), min(3, case.batch.num_requests))
    ):
        mask = row_visibility(case, request)
        rows = list(range(case.batch.new_tokens()[request]))
        got = rows_ranges(case, request, rows)
        assert got == {r: ranges_of(mask[r]) for r in rows}
