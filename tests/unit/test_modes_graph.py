"""Graph mode (issue 18) on the CPU, where "capture" is a plain replay of the same call over
the static buffers: the bookkeeping (static buffers at the variant's largest batch, stale table
columns, padding requests, pool pages past the case's, host arguments fixed at capture), the
verdicts (oracle and bit for bit against eager), and a planted kernel that reads a stale column
only under replay, found and shrunk by a campaign.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _planted import (  # noqa: F401  (fixtures)
    PLANTED_MODES_FILE,
    campaign,
    difftest,
    one_torch_thread,
    planted_modes_fixture,
)

from difftest.campaign.planning import CampaignConfig, Planner, share_graph
from difftest.execution import graph_replay
from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import PAGE_DIM, materialize, stale_buffers
from difftest.generation.modes import Modes
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec
from difftest.model.graph_spec import GraphSpec
from difftest.model.outcome import Outcome
from difftest.paths import get_path
from difftest.paths.kernel_args import max_seq_len
from difftest.records.repro import load_repro

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_static_buffers() -> Iterator[None]:
    graph_replay.clear()
    yield
    graph_replay.clear()


def graph_case(graph: GraphSpec, *, padding_requests: int = 1, L: int = 2) -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(
            mode="target_verify",
            prefix_lens=(5, 9),
            q_len=L,
            padding_requests=padding_requests,
        ),
        pool=PoolSpec(page_order="shuffled"),
        seed=11,
        graph=graph,
    )


GRAPH = GraphSpec(extra_requests=2, extra_columns=3, extra_pages=4, seed=7)


def test_a_replay_sees_the_case_in_front_of_what_earlier_batches_left() -> None:
    case = graph_case(GRAPH)
    batch = materialize(case, CPU)
    static = graph_replay._static_set(case, GRAPH, CPU)
    shape = graph_replay.StaticShape.of(case, GRAPH)
    b = case.batch
    width = case.table_width()
    # static buffers at the variant's largest batch, table and pool
    assert shape.requests == b.num_requests + 2 == static.table.shape[0] == static.q.shape[0] // 2
    assert shape.columns == width + 3 == static.table.shape[1]
    assert shape.pages == case.num_pages() + 4
    q0, table0, storage0 = stale_buffers(case, shape.requests, shape.columns, shape.pages, 7, CPU)
    loaded = graph_replay.load(static, batch)

    real_rows = len(b.prefix_lens) * b.q_len
    assert torch.equal(loaded.q[:real_rows], batch.q[:real_rows])
    # the padding request's query rows are what earlier batches left (not the case's own)
    assert torch.equal(loaded.q_padded[real_rows:], q0[real_rows : b.num_query_rows])
    assert not torch.equal(loaded.q_padded[real_rows:], batch.q_padded[real_rows:])
    # the table: the case's columns in front, stale page ids (valid ones) past its width
    assert loaded.block_tables.shape == (b.num_requests, width + 3)
    assert torch.equal(loaded.block_tables[:, :width], batch.block_tables)
    assert torch.equal(loaded.block_tables[:, width:], table0[: b.num_requests, width:])
    assert int(loaded.block_tables.max()) < shape.pages
    assert torch.equal(loaded.seq_lens, batch.seq_lens)
    # the pool: the case's pages in front, stale K/V on the pages past them
    dim = PAGE_DIM[case.pool.kv_storage]
    mine = batch.kv_storage.shape[dim]
    assert torch.equal(loaded.kv_storage.narrow(dim, 0, mine), batch.kv_storage)
    stale = storage0.narrow(dim, mine, shape.pages - mine)
    assert torch.equal(loaded.kv_storage.narrow(dim, mine, shape.pages - mine), stale)
    # host arguments are the capture's (here the case's own: no extra, no scales)
    assert max_seq_len(loaded.case) == max_seq_len(case.replace(graph=None))


def test_each_replay_starts_from_the_same_stale_contents() -> None:
    big = graph_case(GRAPH)
    static = graph_replay._static_set(big, GRAPH, CPU)
    first = graph_replay.load(static, materialize(big, CPU))
    kept = (first.q_padded.clone(), first.block_tables.clone(), first.kv_storage.clone())
    other = big.replace(seed=12)  # same static shape, other values
    assert graph_replay._static_set(other, GRAPH, CPU) is static
    graph_replay.load(static, materialize(other, CPU))
    again = graph_replay.load(static, materialize(big, CPU))
    assert torch.equal(again.q_padded, kept[0])
    assert torch.equal(again.block_tables, kept[1])
    assert torch.equal(again.kv_storage, kept[2])


def test_host_arguments_fixed_at_capture_are_what_the_replayed_call_gets() -> None:
    case = graph_case(
        dataclasses.replace(GRAPH, extra_max_seq_len=16, bmm1_scale=0.5, bmm2_scale=2.0)
    )
    loaded = graph_replay.load(
        graph_replay._static_set(case, case.graph, CPU),  # type: ignore[arg-type]
        materialize(case, CPU),
    )
    assert max_seq_len(loaded.case) == case.context_len() + 16
    assert (loaded.bmm1_scale, loaded.bmm2_scale) == (0.5, 2.0)
    [result] = evaluate(case, [get_path("torch-sdpa")], CPU).results
    # torch-sdpa reads no host max_seq_len, and is compared with its eager call at the
    # graph's scales: it agrees, and the verdict records what the capture fixed
    assert result.outcome is Outcome.AGREE, result.reason
    diff = result.metrics.graph
    assert diff is not None and diff.differing_elements == 0 and not diff.captured
    host = {h.name: (h.replay, h.eager) for h in diff.host_args}
    assert host["max_seq_len"] == (case.context_len() + 16, case.context_len())
    assert host["bmm1_scale"] == (0.5, case.attention.bmm1_scale)
    assert host["bmm2_scale"] == (2.0, case.attention.bmm2_scale)
    assert (diff.stale_columns, diff.stale_pages) == (3, 4)
    assert diff.stale_query_rows == case.batch.q_len  # one padding request


def test_the_cpu_paths_replay_bit_for_bit() -> None:
    paths = [get_path("torch-sdpa"), get_path("torch-paged-online")]
    for extra in (0, 1, 5):
        case = graph_case(dataclasses.replace(GRAPH, extra_columns=extra))
        for r in evaluate(case, paths, CPU).results:
            assert r.outcome is Outcome.AGREE, r.reason
            assert r.metrics.graph is not None and r.metrics.graph.differing_elements == 0


def test_a_kernel_reading_a_stale_column_only_under_replay_is_a_graph_mismatch(
    planted_modes: ModuleType,
) -> None:
    path = get_path(planted_modes.STALE_COLUMN)
    eager = evaluate(graph_case(GRAPH).replace(graph=None), [path], CPU).results[0]
    assert eager.outcome is Outcome.AGREE  # an exact-width table hides the bug
    no_stale = graph_case(dataclasses.replace(GRAPH, extra_columns=0))
    assert evaluate(no_stale, [path], CPU).results[0].outcome is Outcome.AGREE
    [r] = evaluate(graph_case(GRAPH), [path], CPU).results
    assert r.outcome is Outcome.GRAPH_MISMATCH
    assert r.detail == "beyond-tolerance"
    assert "3 stale page-table columns" in r.reason
    diff = r.metrics.graph
    assert diff is not None and diff.differing_elements > 0 and diff.stale_columns == 3


def test_graph_campaign_cases_of_a_variant_share_one_static_shape() -> None:
    config = CampaignConfig(seed=3, cases_per_variant=6, max_variants=4, modes=Modes(graph=True))
    planner = Planner(config, CPU)
    by_variant: dict[object, set[graph_replay.StaticShape]] = {}
    host_changes = 0
    seen = 0
    for _, case in planner:
        assert case.graph is not None and case.convention == "sglang"
        assert not case.batch.is_ragged
        by_variant.setdefault(case.compile_variant(), set()).add(
            graph_replay.StaticShape.of(case, case.graph)
        )
        host_changes += case.graph.extra_max_seq_len > 0 or case.graph.changes_scales
        seen += 1
    assert seen >= 8
    assert all(len(shapes) == 1 for shapes in by_variant.values()), by_variant
    assert host_changes > 0  # cases that change host arguments between capture and replay
    # share_graph leaves cases without a graph alone
    plain = graph_case(GRAPH).replace(graph=None)
    assert share_graph([plain]) == [plain]


def test_one_static_shape_for_a_variant_of_short_and_long_requests_is_a_valid_case() -> None:
    """A GPU variant mixes a few-token request with a 100k-token one (page size 1): the
    static pool is the long one's, thousands of pages past the short one's own (seen on the
    H200: ``graph.extra_pages=7776`` was refused, ending the campaign with exit 2)."""
    attention = AttentionConfig(num_qo_heads=1, num_kv_heads=1, head_dim=64, page_size=1)

    def one(prefix: int) -> Case:
        batch = BatchSpec(mode="target_verify", prefix_lens=(prefix,), q_len=2)
        case = Case(attention=attention, batch=batch, convention="sglang", seed=1)
        return case.replace(graph=GraphSpec(extra_pages=1, seed=5))

    short, long = one(8), one(100_000)
    shared = share_graph([short, long])  # each built (and checked) as a Case
    assert len({graph_replay.StaticShape.of(c, c.graph) for c in shared if c.graph}) == 1
    assert shared[0].graph is not None and shared[0].graph.extra_pages > 4096
    assert shared[1].graph is not None and shared[1].graph.extra_pages == 1


def test_a_graph_campaign_finds_and_shrinks_the_stale_column_bug(
    planted_modes: ModuleType, tmp_path: Path
) -> None:
    report = campaign(
        tmp_path,
        ("torch-sdpa", planted_modes.STALE_COLUMN),
        plugins=(str(PLANTED_MODES_FILE),),
        modes=Modes(graph=True),
        max_cases=60,
        shrink_runs=300,
    )
    groups = [g for g in report.groups if g.kind is Outcome.GRAPH_MISMATCH]
    assert groups, [(g.path, g.kind) for g in report.groups]
    g = groups[0]
    assert g.path == planted_modes.STALE_COLUMN
    assert "graph" in g.trigger and "graph_columns" in g.trigger
    assert g.minimal is not None
    repro = load_repro(Path(g.minimal))
    case = repro.case
    assert case.graph is not None and case.graph.extra_columns == 1  # one stale column
    assert case.batch.num_requests == 1 and case.batch.q_len == 1
    assert json.loads(Path(g.minimal).read_text())["case"]["graph"]["extra_columns"] == 1
    # replaying the repro's case gives the same finding; without the graph it agrees
    again = evaluate(case, [get_path(planted_modes.STALE_COLUMN)], CPU).results[0]
    assert again.outcome is Outcome.GRAPH_MISMATCH
    eager = evaluate(case.replace(graph=None), [get_path(planted_modes.STALE_COLUMN)], CPU)
    assert eager.results[0].outcome is Outcome.AGREE

    # a fresh process replays the repro (its graph recorded in the case) and still fails
    proc = difftest("replay", g.minimal, "--plugin", str(PLANTED_MODES_FILE), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "still fails" in proc.stdout and "GRAPH_MISMATCH" in proc.stdout, proc.stdout


def test_graph_mode_refuses_packed_launches_with_one_line(tmp_path: Path) -> None:
    proc = difftest("run", "--device", "cpu", "--graph", "--pack", "2", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "difftest: error: --graph replays each case alone: --pack 2 cannot be used"
    ], proc.stderr
