"""Shrinking the production modes: ragged requests toward uniform and fewer new tokens, the
skip-softmax factor away, a graph's static buffers toward the case's own size and host
arguments toward the case's. All runtime arguments: no new compile variant (but for the
ragged kernel's: uniform queries on XQA)."""

from __future__ import annotations

import dataclasses
from typing import Any

from difftest.model.case import Case
from difftest.model.graph_spec import GraphSpec
from difftest.reduction.probe import Probe, Setter, attempt, first_accepted, search_down


def uniform_queries(case: Case, probe: Probe) -> Case:
    """Every request with ``L`` new tokens (the uniform case)."""
    if not case.batch.is_ragged:
        return case
    return attempt(
        case, probe, lambda: case.replace(batch=dataclasses.replace(case.batch, q_lens=None))
    )


def _count_setter(index: int) -> Setter:
    def setter(case: Case, value: int) -> Case:
        b = case.batch
        assert b.q_lens is not None
        counts = list(b.q_lens)
        counts[index] = value
        return case.replace(batch=b.with_real_requests(b.prefix_lens, tuple(counts)))

    return setter


def fewer_new_tokens(case: Case, probe: Probe) -> Case:
    """Each ragged request's new tokens, toward one."""
    for b in range(len(case.batch.prefix_lens)):
        q_lens = case.batch.q_lens
        if q_lens is None:
            return case
        case = search_down(case, probe, q_lens[b], 1, _count_setter(b))
    return case


def no_skip_softmax(case: Case, probe: Probe) -> Case:
    a = case.attention
    if a.skip_softmax_threshold_scale_factor is None:
        return case
    attention = dataclasses.replace(a, skip_softmax_threshold_scale_factor=None)
    return attempt(case, probe, lambda: case.replace(attention=attention))


def _graph(case: Case, **changes: Any) -> Case:
    assert case.graph is not None
    return case.replace(graph=dataclasses.replace(case.graph, **changes))


def _graph_setter(name: str) -> Setter:
    return lambda case, value: _graph(case, **{name: value})


def no_graph(case: Case, probe: Probe) -> Case:
    """Eager calls only (keeps only failures that are not the graph's)."""
    if case.graph is None:
        return case
    return attempt(case, probe, lambda: case.replace(graph=None))


def smaller_graph(case: Case, probe: Probe) -> Case:
    """The static buffers the case's own size and the host arguments the case's, at once;
    else each field toward it (the captured scales dropped, the stale contents' seed 0)."""
    g = case.graph
    if g is None:
        return case
    L = case.batch.q_len
    least = GraphSpec(extra_requests=-(-case.batch.padding_rows // L))
    if g == least:
        return case
    case = attempt(case, probe, lambda: case.replace(graph=least))
    for name in ("extra_columns", "extra_pages", "extra_requests", "extra_max_seq_len"):
        if case.graph is None:
            return case
        floor = least.extra_requests if name == "extra_requests" else 0
        case = search_down(case, probe, getattr(case.graph, name), floor, _graph_setter(name))
    if case.graph is not None and case.graph.changes_scales:
        case = first_accepted(
            case,
            probe,
            [
                lambda: _graph(case, bmm1_scale=None, bmm2_scale=None),
                lambda: _graph(case, bmm1_scale=None),
                lambda: _graph(case, bmm2_scale=None),
            ],
        )
    if case.graph is not None and case.graph.seed != 0:
        case = attempt(case, probe, lambda: _graph(case, seed=0))
    return case
