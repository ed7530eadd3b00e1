"""The production-mode options of ``run``, ``bench``, the gate and ``replay``: ``--graph``,
``--ragged``, ``--skip-softmax``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from difftest.model.case import Case
from difftest.model.errors import DifftestError, InvalidCase
from difftest.model.graph_spec import GraphSpec

if TYPE_CHECKING:
    from difftest.generation.modes import Modes


def add_mode_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph",
        action="store_true",
        help="replay every case under a CUDA graph, as a serving engine does (static buffers "
        "with stale contents, host arguments fixed at capture), judged against the oracle "
        "and bit for bit against the eager call; runs each case alone (--pack 1)",
    )
    p.add_argument(
        "--ragged",
        action="store_true",
        help="draw ragged verify batches too (requests with different numbers of new tokens)",
    )
    p.add_argument(
        "--skip-softmax",
        action="store_true",
        help="set skip_softmax_threshold_scale_factor on every case: paths that apply it are "
        "held to exact attention plus the skip allowance, the others must match exact "
        "attention (IGNORES)",
    )


def modes_of(args: argparse.Namespace) -> Modes:
    """The :class:`Modes` the options ask for (checked against ``--pack``)."""
    from difftest.generation.modes import Modes  # hypothesis: only when a run is planned

    modes = Modes(ragged=args.ragged, skip_softmax=args.skip_softmax, graph=args.graph)
    pack = getattr(args, "pack", None)
    if modes.graph and pack is not None and pack > 1:
        raise DifftestError(f"--graph replays each case alone: --pack {pack} cannot be used")
    return modes


def add_replay_graph_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph",
        action="store_true",
        help="replay a repro's case under a CUDA graph even if it was found eagerly "
        f"(static buffers {DEFAULT_GRAPH.extra_columns} columns and {DEFAULT_GRAPH.extra_pages} "
        "pages larger, in SGLang's convention); a case that records a graph replays it anyway",
    )


DEFAULT_GRAPH = GraphSpec(extra_requests=1, extra_columns=2, extra_pages=4)
"""The graph ``replay --graph`` gives a case that has none."""


def graphed(case: Case) -> Case:
    """``case`` under a graph replay (its own graph if it has one, else :data:`DEFAULT_GRAPH`
    with room for its padding rows), in SGLang's convention; a one-line error when the case
    cannot be replayed so (ragged)."""
    if case.graph is not None:
        return case
    L = case.batch.q_len
    extra = max(DEFAULT_GRAPH.extra_requests, -(-case.batch.padding_rows // L))
    graph = GraphSpec(
        extra_requests=extra,
        extra_columns=DEFAULT_GRAPH.extra_columns,
        extra_pages=DEFAULT_GRAPH.extra_pages,
    )
    try:
        return case.replace(convention="sglang", graph=graph)
    except InvalidCase as e:
        raise DifftestError(f"--graph: this case cannot be replayed under a graph: {e}") from None
