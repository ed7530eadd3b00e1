"""Graph replay: run a case the way a serving engine's CUDA graph runs it, and judge it.

For a case with a :class:`~difftest.model.graph_spec.GraphSpec`, the static buffers of its
variant and static shape (query rows, KV pool, page table, ``seq_lens``) are allocated once
and filled with what earlier batches left there
(:func:`~difftest.generation.materialize.stale_buffers`).
Each path's call is captured once per batch-size bucket and host arguments, over views of
those buffers (:attr:`PathModes.capture <difftest.paths.modes.PathModes.capture>`; a path
without one is called again on them). Each replay first restores the buffers to what the
earlier batches left (so a case replays the same way alone and in a campaign), copies the
case's values in as an engine does (the real requests' query rows; every request's
``seq_lens`` and page-table columns up to the case's width; its pool pages) and replays. What
the copy leaves is exactly what an engine leaves: the padding requests' query rows, the table
columns past the case's width, the pool pages past its pages. Host arguments are the
capture's: ``max_seq_len`` (the case's context length plus the graph's extra) and the scales
(the graph's, when it has its own).

The replay is judged against the oracle of what its kernel saw, and bit for bit against the
eager call with the same host scales (:mod:`difftest.judgement.graph`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from difftest.execution import packing
from difftest.generation.materialize import PAGE_DIM, hnd_view, stale_buffers
from difftest.judgement import graph as graph_verdict
from difftest.judgement import tolerance as compare
from difftest.machine.memory import out_of_memory
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.graph_spec import GraphSpec
from difftest.model.outcome import GraphDiff, Outcome, PathResult
from difftest.oracle import fused
from difftest.paths.kernel_args import max_seq_len
from difftest.paths.modes import Replay
from difftest.paths.registry import KernelPath

MAX_STATIC_SETS = 4
"""Static buffer sets kept at once (each with the graphs captured over it)."""

StickyCheck = Callable[[BaseException], bool]
RunPath = Callable[[KernelPath, Batch], tuple[torch.Tensor | None, PathResult]]
"""How a path is run with its failures caught (:func:`difftest.execution.evaluate.run_path`)."""
Bound = Callable[[Batch, torch.Tensor], torch.Tensor]
"""``(batch, oracle output) -> [bs]`` the bounds the path is held to on ``batch``."""


@dataclass(frozen=True, slots=True)
class StaticShape:
    """The sizes of one graph's static buffers."""

    requests: int
    columns: int
    pages: int

    @classmethod
    def of(cls, case: Case, g: GraphSpec) -> StaticShape:
        return cls(
            requests=case.batch.num_requests + g.extra_requests,
            columns=case.table_width() + g.extra_columns,
            pages=case.num_pages() + g.extra_pages,
        )


@dataclass(eq=False)
class StaticSet:
    """One set of static buffers, what earlier batches left in them, and the graphs captured
    over them (by path, bucket and host arguments)."""

    q: torch.Tensor
    table: torch.Tensor
    seq_lens: torch.Tensor
    storage: torch.Tensor
    sinks: torch.Tensor | None
    stale: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    """The pristine ``(q, table, storage)`` (restored before every replay)."""
    graphs: dict[Hashable, Replay] = field(default_factory=dict)

    def restore(self) -> None:
        self.q.copy_(self.stale[0])
        self.table.copy_(self.stale[1])
        self.storage.copy_(self.stale[2])
        self.seq_lens.fill_(1)


_SETS: OrderedDict[Hashable, StaticSet] = OrderedDict()


def _static_key(case: Case, g: GraphSpec, device: torch.device) -> Hashable:
    a = case.attention
    return (
        str(device),
        (a.q_dtype, a.kv_dtype, a.num_qo_heads, a.num_kv_heads, a.head_dim, a.page_size),
        a.sinks,
        case.batch.q_len,
        case.pool.kv_storage,
        StaticShape.of(case, g),
        g.seed,
    )


def _static_set(case: Case, g: GraphSpec, device: torch.device) -> StaticSet:
    key = _static_key(case, g, device)
    found = _SETS.get(key)
    if found is not None:
        _SETS.move_to_end(key)
        return found
    shape = StaticShape.of(case, g)
    stale = stale_buffers(case, shape.requests, shape.columns, shape.pages, g.seed, device)
    a = case.attention
    sinks = torch.zeros(a.num_qo_heads, dtype=torch.float32, device=device) if a.sinks else None
    made = StaticSet(
        q=stale[0].clone(),
        table=stale[1].clone(),
        seq_lens=torch.ones(shape.requests, dtype=torch.int32, device=device),
        storage=stale[2].clone(),
        sinks=sinks,
        stale=stale,
    )
    _SETS[key] = made
    while len(_SETS) > MAX_STATIC_SETS:
        _SETS.popitem(last=False)
    return made


def clear() -> None:
    """Drop every static buffer set and captured graph (tests; a new device)."""
    _SETS.clear()


def host_case(case: Case) -> Case:
    """``case`` as the captured call sees its host arguments: the graph's scales (when it has
    its own) and ``max_seq_len`` (the context length plus the graph's extra)."""
    g = case.graph
    assert g is not None
    return _with_scales(case, g).replace(
        pool=dataclasses.replace(case.pool, context_len=case.graph_max_seq_len()), graph=None
    )


def _with_scales(case: Case, g: GraphSpec) -> Case:
    """``case`` with the graph's host scales (``bmm1`` as ``sm_scale``, ``bmm2`` as
    ``v_scale``, the other scales 1: the same two numbers reach the kernel)."""
    if not g.changes_scales:
        return case
    a = case.attention
    attention = dataclasses.replace(
        a,
        sm_scale=g.bmm1_scale if g.bmm1_scale is not None else a.bmm1_scale,
        q_scale=1.0,
        k_scale=1.0,
        v_scale=g.bmm2_scale if g.bmm2_scale is not None else a.bmm2_scale,
        o_scale=1.0,
    )
    return case.replace(attention=attention)


def load(static: StaticSet, batch: Batch) -> Batch:
    """Copy ``batch``'s values into the static buffers as an engine does and return the batch
    the replayed kernel sees (views of the buffers, the capture's host arguments)."""
    case = batch.case
    b = case.batch
    bs, L = b.num_requests, b.q_len
    width = case.table_width()
    static.restore()
    real_rows = len(b.prefix_lens) * L
    static.q[:real_rows].copy_(batch.q[:real_rows])
    static.table[:bs, :width].copy_(batch.block_tables)
    static.seq_lens[:bs].copy_(batch.seq_lens)
    dim = PAGE_DIM[case.pool.kv_storage]
    static.storage.narrow(dim, 0, batch.kv_storage.shape[dim]).copy_(batch.kv_storage)
    if static.sinks is not None and batch.sinks is not None:
        static.sinks.copy_(batch.sinks)
    seen = host_case(case)
    return Batch(
        case=seen,
        device=batch.device,
        q_padded=static.q[: b.num_query_rows + b.padding_rows],
        kv_storage=static.storage,
        kv_cache=hnd_view(seen, static.storage),
        block_tables=static.table[:bs],
        seq_lens=static.seq_lens[:bs],
        sinks=static.sinks,
        draft_mask=batch.draft_mask,
    )


def _graph_key(path: KernelPath, loaded: Batch) -> Hashable:
    """What one captured graph is for: the path, and every launch-wide host argument and
    shape of the loaded batch (its bucket: requests and query rows)."""
    case = loaded.case
    return (
        path.name,
        packing.pack_key(case),
        case.batch.num_requests,
        loaded.q_padded.shape[0],
    )


def _replayer(path: KernelPath, static: StaticSet, loaded: Batch) -> tuple[Replay, bool]:
    """``(replay, captured)``: the path's captured graph for ``loaded`` (captured now over the
    loaded buffers, the first time), or a call of the path on them."""
    if path.modes.capture is None:
        return path.run, False
    key = _graph_key(path, loaded)
    replay = static.graphs.get(key)
    if replay is None:
        replay = path.modes.capture(loaded)
        static.graphs[key] = replay
    return replay, True


def judge_replay(
    path: KernelPath,
    batch: Batch,
    eager_out: torch.Tensor,
    eager: PathResult,
    run_path: RunPath,
    bound: Bound,
    is_sticky_device_error: StickyCheck,
) -> PathResult:
    """The path's verdict on ``batch``'s graph case (see the module docstring): its eager
    verdict when that is a finding; else its replay's, against the oracle and bit for bit
    against the eager call."""
    case = batch.case
    g = case.graph
    assert g is not None
    if eager.outcome.is_finding:
        return eager
    static = _static_set(case, g, batch.device)
    loaded = load(static, batch)
    clock = time.perf_counter()
    try:
        replay_fn, captured = _replayer(path, static, loaded)
        out = replay_fn(loaded)
        if batch.device.type == "cuda":
            torch.cuda.synchronize(batch.device)
        out = out.clone()
    except Exception as exc:  # the capture or the replay refused: a finding of the graph
        static.graphs.pop(_graph_key(path, loaded), None)
        if out_of_memory(exc):  # no memory for it here: not the graph's verdict
            raise
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sticky = is_sticky_device_error(exc)
        return PathResult(
            path=path.name,
            outcome=Outcome.CRASH if sticky else Outcome.RAISED,
            detail="" if sticky else f"graph:{type(exc).__name__}",
            reason=f"graph replay: {type(exc).__name__}: {text}",
            seconds=eager.seconds + time.perf_counter() - clock,
            backend=eager.backend,
        )
    seconds = time.perf_counter() - clock
    ref = compare.reference(loaded, fused.batched_attention)
    replay = compare.judge(path.name, loaded, out, ref, bound(loaded, ref))
    replay = dataclasses.replace(replay, seconds=seconds)

    reference_out, compared_with = eager_out, "the eager call"
    if g.changes_scales:  # the eager call with the scales the graph was captured with
        scaled = dataclasses.replace(batch, case=_with_scales(case, g))
        again, ran = run_path(path, scaled)
        if again is None:
            return dataclasses.replace(
                ran, reason=f"eager call with the graph's scales: {ran.reason}"
            )
        reference_out, compared_with = again, "the eager call with the graph's scales"
    real = len(case.batch.prefix_lens) * case.batch.q_len
    n, gap = graph_verdict.differing_bits(out[:real], reference_out[:real])
    a, seen = case.attention, loaded.case.attention
    diff = GraphDiff(
        captured=captured,
        differing_elements=n,
        max_abs=gap,
        stale_columns=g.extra_columns,
        stale_pages=g.extra_pages,
        stale_query_rows=case.batch.padding_requests * case.batch.q_len + case.batch.padding_rows,
        host_args=graph_verdict.host_args(
            max_seq_len=(max_seq_len(loaded.case), max_seq_len(case)),
            page_table_width=(loaded.block_tables.shape[1], batch.block_tables.shape[1]),
            bmm1_scale=(seen.bmm1_scale, a.bmm1_scale),
            bmm2_scale=(seen.bmm2_scale, a.bmm2_scale),
        ),
    )
    return graph_verdict.verdict(eager, replay, diff, compared_with)
