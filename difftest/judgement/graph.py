"""The verdict on a graph replay: against the oracle, and bit for bit against the eager call.

A replay runs the same kernel call as the eager run, over static buffers: the bits of the real
requests' rows must be the eager call's. Where they are not, the verdict is
``GRAPH_MISMATCH``, with what differed between the two calls' inputs (stale table columns and
pool pages, stale query rows of padding requests, host arguments fixed at capture) in its
metrics. The padding requests' rows are judged against the oracle only: their queries are what
earlier batches left, not the eager call's.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.model.outcome import GraphDiff, HostArg, Outcome, PathResult

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def differing_bits(replay: torch.Tensor, eager: torch.Tensor) -> tuple[int, float]:
    """``(elements whose bits differ, largest |replay - eager| over them)`` of two outputs of
    one dtype (NaN against anything else counts as inf)."""
    ints = _INT_OF_SIZE[replay.element_size()]
    differ = replay.contiguous().view(ints) != eager.contiguous().view(ints)
    n = int(differ.sum())
    if n == 0:
        return 0, 0.0
    gap = (replay.double() - eager.double()).abs()[differ]
    return n, float(torch.nan_to_num(gap, nan=float("inf")).max())


def verdict(
    eager: PathResult,
    replay: PathResult,
    diff: GraphDiff,
    compared_with: str,
) -> PathResult:
    """The path's verdict on a graph case, from its eager verdict (not a finding), its replay's
    verdict against the oracle and the replay's :class:`GraphDiff` against ``compared_with``
    (the eager call it was compared with, in words)."""
    metrics = dataclasses.replace(replay.metrics, graph=diff)
    if diff.differing_elements:
        within = replay.outcome in (Outcome.AGREE, Outcome.IGNORES)
        inputs = describe_inputs(diff)
        how = "captured graph" if diff.captured else "replay on the static buffers"
        return PathResult(
            path=eager.path,
            outcome=Outcome.GRAPH_MISMATCH,
            detail="within-tolerance" if within else "beyond-tolerance",
            reason=f"{how} differs from {compared_with} in {diff.differing_elements} elements "
            f"(max {diff.max_abs:.3g}; {'within' if within else 'beyond'} tolerance of the "
            f"oracle); inputs that differ: {inputs}",
            metrics=metrics,
            seconds=eager.seconds + replay.seconds,
            backend=eager.backend,
        )
    if replay.outcome.is_finding:
        return dataclasses.replace(
            replay,
            detail=f"graph:{replay.detail}" if replay.detail else "graph",
            reason=f"graph replay: {replay.reason}",
            metrics=metrics,
            seconds=eager.seconds + replay.seconds,
            backend=eager.backend,
        )
    return dataclasses.replace(
        eager,
        metrics=dataclasses.replace(eager.metrics, graph=diff),
        seconds=eager.seconds + replay.seconds,
    )


def describe_inputs(diff: GraphDiff) -> str:
    """What the replay's kernel was given that the eager call was not, in words."""
    parts = [f"{h.name} {h.replay:g} (eager {h.eager:g})" for h in diff.host_args]
    if diff.stale_columns:
        parts.append(f"{diff.stale_columns} stale page-table columns")
    if diff.stale_pages:
        parts.append(f"{diff.stale_pages} stale pool pages")
    if diff.stale_query_rows:
        parts.append(f"{diff.stale_query_rows} stale query rows (padding)")
    return ", ".join(parts) or "none"


def host_args(**pairs: tuple[float, float]) -> tuple[HostArg, ...]:
    """The ``name=(replay, eager)`` pairs that differ, as :class:`HostArg` records."""
    return tuple(
        HostArg(name=name, replay=float(r), eager=float(e))
        for name, (r, e) in pairs.items()
        if r != e
    )
