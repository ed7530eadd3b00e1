"""How a case is replayed under a CUDA graph, the way a serving engine runs a decode step.

An engine captures one graph per batch-size bucket over *static* buffers sized for the largest
batch: the query rows, the KV pool, a page table of static width, ``seq_lens`` and the output.
Each step copies the new batch's values into the front of those buffers and replays the graph.
What the copy does not touch stays as earlier batches left it: the query rows of the padding
requests, the table columns past the batch's width, the pool pages past its pages. Arguments
the kernel takes on the host (``max_seq_len``, the scales) are those of the capture.

A :class:`GraphSpec` says how much larger than the case the static buffers are (so it stays
valid while the shrinker makes the case smaller), which seed fills what earlier batches left
there, and the host arguments the graph was captured with. The replay itself is
:mod:`difftest.execution.graph_replay`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from difftest.model.caps import MAX_REQUESTS, MAX_SCALE, MAX_SEED, MAX_SEQ_LEN, MAX_SPARE_PAGES
from difftest.model.errors import InvalidCase

MAX_EXTRA_COLUMNS = 1 << 16
"""Static page-table columns past a case's own width."""


def _count(name: str, value: object, high: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= high):
        raise InvalidCase(f"graph.{name}", value, f"must be an integer in [0, {high}]")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSpec:
    """Static buffers (as sizes past the case's own), what earlier batches left in them, and
    the host arguments fixed at capture."""

    extra_requests: int = 0
    """Static batch rows past the case's requests (padding ones included): the largest batch
    of the graph's variant minus this one. Data-parallel padding rows of the case must fit in
    them (``extra_requests * L >= padding_rows``)."""
    extra_columns: int = 0
    """Static page-table columns past the case's table width: every request's row holds stale
    page ids there."""
    extra_pages: int = 0
    """Static pool pages past the case's pages: stale K/V that no live token owns."""
    extra_max_seq_len: int = 0
    """The host ``max_seq_len`` (``max_kv_len``) captured, minus the case's own: a graph
    captured for a longer batch replays it for this one."""
    bmm1_scale: float | None = None
    """The host ``bmm1_scale`` captured; ``None``: the case's own."""
    bmm2_scale: float | None = None
    """The host ``bmm2_scale`` captured; ``None``: the case's own."""
    seed: int = 0
    """What earlier batches left in the static buffers (query rows, page ids, K/V)."""

    def __post_init__(self) -> None:
        _count("extra_requests", self.extra_requests, MAX_REQUESTS)
        _count("extra_columns", self.extra_columns, MAX_EXTRA_COLUMNS)
        _count("extra_pages", self.extra_pages, MAX_SPARE_PAGES)
        _count("extra_max_seq_len", self.extra_max_seq_len, MAX_SEQ_LEN)
        _count("seed", self.seed, MAX_SEED - 1)
        for name in ("bmm1_scale", "bmm2_scale"):
            value = getattr(self, name)
            if value is None:
                continue
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and 1 / MAX_SCALE <= value <= MAX_SCALE
            )
            if not ok:
                raise InvalidCase(
                    f"graph.{name}", value, "must be a finite number in [2**-32, 2**32]"
                )

    @property
    def changes_scales(self) -> bool:
        """Whether the graph was captured with scales of its own (else the case's)."""
        return self.bmm1_scale is not None or self.bmm2_scale is not None
