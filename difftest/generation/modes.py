"""The production modes of generated cases: ragged verify, skip-softmax, graph replay.

:func:`with_modes` draws them once a case is complete (:mod:`difftest.generation.strategies`
calls it last, and only when a mode is on: with every mode off, a case makes the draws it
made before the modes existed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from difftest.model.case import Case
from difftest.model.graph_spec import GraphSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Modes:
    """Which production modes generated cases use (all off by default)."""

    ragged: bool = False
    """About half the cases of two or more requests get their own new-token counts."""
    skip_softmax: bool = False
    """Every case sets ``skip_softmax_threshold_scale_factor``."""
    graph: bool = False
    """Every case is replayed under a CUDA graph (SGLang's convention, a uniform ``L``)."""


NO_MODES = Modes()
SKIP_FACTORS = (0.01, 0.1, 0.001, 1.0, 0.3)
"""Skip-softmax factors drawn first (shrinking toward small ones), then any in
``[1e-4, 4]``."""


@st.composite
def with_modes(draw: st.DrawFn, case: Case, modes: Modes) -> Case:
    """``case`` in the production modes asked for (``case`` itself when none is)."""
    if modes.ragged and not modes.graph:  # SGLang pads ragged batches under graphs
        case = draw(_ragged(case))
    if modes.skip_softmax:
        factor = draw(
            st.one_of(
                st.sampled_from(SKIP_FACTORS),
                st.floats(min_value=1e-4, max_value=4.0, allow_nan=False, allow_infinity=False),
            )
        )
        attn = dataclasses.replace(case.attention, skip_softmax_threshold_scale_factor=factor)
        case = case.replace(attention=attn)
    if modes.graph:
        case = draw(_graphed(case))
    return case


@st.composite
def _ragged(draw: st.DrawFn, case: Case) -> Case:
    """About half the cases of two or more requests: each request's own number of new tokens
    (one of them ``L``, not all)."""
    b = case.batch
    n = len(b.prefix_lens)
    if n < 2 or b.q_len < 2 or not draw(st.booleans()):
        return case
    counts = [draw(st.integers(1, b.q_len)) for _ in range(n)]
    longest = draw(st.integers(0, n - 1))
    counts[longest] = b.q_len
    if min(counts) == b.q_len:
        other = (longest + 1 + draw(st.integers(0, n - 2))) % n
        counts[other] = draw(st.integers(1, b.q_len - 1))
    return case.replace(batch=dataclasses.replace(b, q_lens=tuple(counts)))


@st.composite
def _graphed(draw: st.DrawFn, case: Case) -> Case:
    """A graph replay (SGLang's convention): static buffers a few requests, columns and pages
    larger than the case, sometimes captured for a longer ``max_seq_len`` or other scales."""
    case = case.replace(convention="sglang")
    L, ps = case.batch.q_len, case.attention.page_size
    a = case.attention
    scales: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:  # a quarter of the graphs were captured with other scales
        scales["bmm1_scale"] = a.bmm1_scale * draw(st.sampled_from([0.5, 2.0]))
        if draw(st.booleans()):
            scales["bmm2_scale"] = a.bmm2_scale * draw(st.sampled_from([0.5, 2.0]))
    graph = GraphSpec(
        extra_requests=-(-case.batch.padding_rows // L) + draw(st.integers(0, 3)),
        extra_columns=draw(st.integers(0, 4)),
        extra_pages=draw(st.integers(0, 8)),
        extra_max_seq_len=draw(st.sampled_from([0, ps, 4 * ps, 1])),
        seed=draw(st.integers(0, 2**32 - 1)),
        **scales,
    )
    return case.replace(graph=graph)
