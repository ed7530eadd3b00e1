"""The production modes of generated cases: ragged verify, skip-softmax, graph replay.

:func:`moded_case` chooses them once a case is complete (:mod:`difftest.generation.strategies`
calls it last, and only when a mode is on: with every mode off, a case makes the choices it
made before the modes existed); :func:`with_modes` is its Hypothesis strategy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from difftest.generation.choices import Choices, composite
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


def moded_case(ch: Choices, case: Case, modes: Modes) -> Case:
    """``case`` in the production modes asked for (``case`` itself when none is)."""
    if modes.ragged and not modes.graph:  # SGLang pads ragged batches under graphs
        case = _ragged(ch, case)
    if modes.skip_softmax:
        factor = ch.real(1e-4, 4.0) if ch.flag() else ch.pick(SKIP_FACTORS)
        attn = dataclasses.replace(case.attention, skip_softmax_threshold_scale_factor=factor)
        case = case.replace(attention=attn)
    if modes.graph:
        case = _graphed(ch, case)
    return case


with_modes = composite(moded_case)


def _ragged(ch: Choices, case: Case) -> Case:
    """About half the cases of two or more requests: each request's own number of new tokens
    (one of them ``L``, not all)."""
    b = case.batch
    n = len(b.prefix_lens)
    if n < 2 or b.q_len < 2 or not ch.flag():
        return case
    return case.replace(batch=dataclasses.replace(b, q_lens=ragged_counts(ch, n, b.q_len)))


def ragged_counts(ch: Choices, n: int, q_len: int) -> tuple[int, ...]:
    """New-token counts for ``n >= 2`` requests of a ragged batch: each in ``[1, q_len]``, one
    of them ``q_len`` (the batch's ``L``), not all of them."""
    counts = [ch.integer(1, q_len) for _ in range(n)]
    longest = ch.integer(0, n - 1)
    counts[longest] = q_len
    if min(counts) == q_len:
        other = (longest + 1 + ch.integer(0, n - 2)) % n
        counts[other] = ch.integer(1, q_len - 1)
    return tuple(counts)


def _graphed(ch: Choices, case: Case) -> Case:
    """A graph replay (SGLang's convention): static buffers a few requests, columns and pages
    larger than the case, sometimes captured for a longer ``max_seq_len`` or other scales."""
    case = case.replace(convention="sglang")
    L, ps = case.batch.q_len, case.attention.page_size
    a = case.attention
    scales: dict[str, Any] = {}
    if ch.integer(0, 3) == 0:  # a quarter of the graphs were captured with other scales
        scales["bmm1_scale"] = a.bmm1_scale * ch.pick((0.5, 2.0))
        if ch.flag():
            scales["bmm2_scale"] = a.bmm2_scale * ch.pick((0.5, 2.0))
    graph = GraphSpec(
        extra_requests=-(-case.batch.padding_rows // L) + ch.integer(0, 3),
        extra_columns=ch.integer(0, 4),
        extra_pages=ch.integer(0, 8),
        extra_max_seq_len=ch.pick((0, ps, 4 * ps, 1)),
        seed=ch.integer(0, 2**32 - 1),
        **scales,
    )
    return case.replace(graph=graph)
