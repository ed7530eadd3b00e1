"""The case model: a frozen, versioned, JSON-serialisable spec of one logical batch.

A :class:`Case` says everything needed to rebuild a batch bit for bit on any machine: the
attention configuration, the batch shape (prefix lengths, the uniform new-token count ``L``,
the draft mask, padding), the paged pool (page order, sharing, table width and fill, stale
data), the value family and the seed. Derived quantities are methods, never stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from difftest.model.caps import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_PADDING_ROWS,
    MAX_PAGE_SIZE,
    MAX_POOL_ELEMENTS,
    MAX_Q_LEN,
    MAX_QUERY_ELEMENTS,
    MAX_REQUESTS,
    MAX_SCALE,
    MAX_SEED,
    MAX_SEQ_LEN,
    MAX_SPARE_PAGES,
    MAX_WORK,
    estimated_bytes,
)
from difftest.model.errors import FormatError, InvalidCase, shown
from difftest.model.graph_spec import GraphSpec

CASE_FORMAT = "difftest-case/1"

Mode = Literal["target_verify", "draft_extend_v2"]
QDtype = Literal["bf16", "fp16"]
KVDtype = Literal["bf16", "fp16", "fp8_e4m3"]
OutDtype = Literal["bf16", "fp16"]
KVStorage = Literal["hnd", "nhd", "kv_split_nhd"]
PageOrder = Literal["sequential", "reversed", "shuffled"]
TableWidth = Literal["exact", "context"]
TableFill = Literal["zero", "stale_pages", "out_of_range"]
StaleFill = Literal["zeros", "randn", "large"]
Convention = Literal["sglang", "plain"]
ValueFamily = Literal["randn", "large_logits", "near_ties", "outlier_tokens", "position_coded"]

PADDING_PREFIX_LEN = 1
"""CUDA-graph dummy requests carry ``seq_len`` fill value 1, so their ``T = 1 + L``."""


def _check(ok: bool, name: str, value: object, why: str) -> None:
    if not ok:
        raise InvalidCase(name, value, why)


def _check_literal(name: str, value: object, lit: Any) -> None:
    allowed = get_args(lit)
    if value not in allowed:  # the message only when it fails: cases are validated often
        raise InvalidCase(name, value, f"must be one of {', '.join(map(repr, allowed))}")


def _is_int(value: object) -> bool:
    """An integer, and not a boolean (JSON's ``true`` is not 1 here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: int) -> None:
    _check(_is_int(value), name, value, "must be an integer")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise InvalidCase(name, value, f"must be in [{low}, {high}]")


def _check_scale(name: str, value: float) -> None:
    _check(
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 1 / MAX_SCALE <= value <= MAX_SCALE,
        name,
        value,
        "must be a finite number in [2**-32, 2**32]",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionConfig:
    """Per-rank attention configuration: heads, dtypes, page size, window, sinks and scales."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: QDtype = "bf16"
    kv_dtype: KVDtype = "bf16"
    out_dtype: OutDtype = "bf16"
    window_left: int = -1
    """``-1``: no window; ``W >= 0``: a row at position p sees keys ``p - W .. p``."""
    sinks: bool = False
    """One float32 sink per query head (values come from the seed)."""
    sm_scale: float | None = None
    """``None`` means ``head_dim ** -0.5``."""
    q_scale: float = 1.0
    k_scale: float = 1.0
    v_scale: float = 1.0
    o_scale: float = 1.0
    skip_softmax_threshold_scale_factor: float | None = None
    """FlashInfer's skip-softmax factor: a KV tile after the first may be skipped when every
    row's ``exp(tile max - running max) < factor / T_b`` (``docs/semantics.md``, "Skip-softmax");
    ``None``: not passed (exact attention)."""

    def __post_init__(self) -> None:
        _check_int("num_qo_heads", self.num_qo_heads, 1, MAX_HEADS)
        _check_int("num_kv_heads", self.num_kv_heads, 1, MAX_HEADS)
        _check_int("head_dim", self.head_dim, 1, MAX_HEAD_DIM)
        _check_int("page_size", self.page_size, 1, MAX_PAGE_SIZE)
        _check(
            self.num_qo_heads % self.num_kv_heads == 0,
            "num_qo_heads",
            self.num_qo_heads,
            f"must be a multiple of num_kv_heads={self.num_kv_heads}",
        )
        _check_literal("q_dtype", self.q_dtype, QDtype)
        _check_literal("kv_dtype", self.kv_dtype, KVDtype)
        _check_literal("out_dtype", self.out_dtype, OutDtype)
        _check_int("window_left", self.window_left, -1, MAX_SEQ_LEN)
        _check(isinstance(self.sinks, bool), "sinks", self.sinks, "must be true or false")
        if self.sm_scale is not None:
            _check_scale("sm_scale", self.sm_scale)
        for name in ("q_scale", "k_scale", "v_scale", "o_scale"):
            _check_scale(name, getattr(self, name))
        if self.skip_softmax_threshold_scale_factor is not None:
            _check_scale(
                "skip_softmax_threshold_scale_factor", self.skip_softmax_threshold_scale_factor
            )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (the GQA ratio)."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def effective_sm_scale(self) -> float:
        return self.sm_scale if self.sm_scale is not None else self.head_dim**-0.5

    @property
    def bmm1_scale(self) -> float:
        """Scale on ``<q, k>`` as stored: ``sm_scale * q_scale * k_scale``."""
        return self.effective_sm_scale * self.q_scale * self.k_scale

    @property
    def bmm2_scale(self) -> float:
        """Scale on ``softmax @ v`` as stored: ``v_scale / o_scale``."""
        return self.v_scale / self.o_scale


@dataclass(frozen=True, slots=True, kw_only=True)
class CausalDraft:
    """A chain draft: row ``i`` sees draft tokens ``0..i`` (plain bottom-right causal)."""

    kind: Literal["causal"] = "causal"

    def parents(self, q_len: int) -> tuple[int, ...]:
        return tuple(range(-1, q_len - 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeDraft:
    """A tree draft: token ``i``'s parent is ``parents[i] < i``; row ``i`` sees its ancestors."""

    parents: tuple[int, ...]
    kind: Literal["tree"] = "tree"

    def __post_init__(self) -> None:
        _check(len(self.parents) >= 1, "draft.parents", self.parents, "must not be empty")
        _check(self.parents[0] == -1, "draft.parents", self.parents, "token 0 is the root (-1)")
        for i, p in enumerate(self.parents[1:], start=1):
            _check(
                _is_int(p) and 0 <= p < i,
                "draft.parents",
                self.parents,
                f"parent of token {i} must be in [0, {i})",
            )


DraftSpec = CausalDraft | TreeDraft


def draft_mask_rows(draft: DraftSpec, q_len: int) -> list[list[bool]]:
    """The ``L x L`` visibility matrix of the draft block (row ``i`` may see draft token ``j``)."""
    parents = draft.parents(q_len) if isinstance(draft, CausalDraft) else draft.parents
    rows = [[False] * q_len for _ in range(q_len)]
    for i in range(q_len):
        j = i
        while j >= 0:
            rows[i][j] = True
            j = parents[j]
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSpec:
    """The logical batch: prefixes, the new-token counts and padding."""

    mode: Mode
    prefix_lens: tuple[int, ...]
    """Cached prefix ``P_b`` of each real request (the new tokens come on top)."""
    q_len: int
    """``L``: new tokens per request (bonus token plus drafts); with :attr:`q_lens`, the
    largest count (the kernels' ``max_q_len``)."""
    draft: DraftSpec = field(default_factory=CausalDraft)
    padding_requests: int = 0
    """Dummy requests a CUDA-graph bucket appends (prefix ``PADDING_PREFIX_LEN``)."""
    padding_rows: int = 0
    """Query rows after the last request that belong to no request (data-parallel padding)."""
    q_lens: tuple[int, ...] | None = None
    """Ragged verify: new tokens of each real request (each in ``1..L``, the largest ``L``,
    not all ``L``); ``None``: every request has ``L`` (the uniform case). Request ``b``'s rows
    are draft tokens ``0..q_lens[b]-1`` (its mask is the draft mask's top-left block).
    CUDA-graph padding requests keep ``L`` rows each."""
    spec_draft_len: int | None = None
    """SGLang's speculative draft length (``speculative_num_draft_tokens``) when it is larger
    than ``L``: a draft-extend batch whose requests all extended by fewer tokens than the
    draft length. Under the SGLang convention the XQA mask buffer is sized by it (uint16
    ``[bs, draft_len, ((draft_len + 31) // 32) * 2]``), not by ``L``. ``None``: equal to ``L``
    (and left out of the JSON, so cases without it keep their digests)."""
    _lens: list[tuple[int, ...]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """:meth:`seq_lens`, once computed (every derived size of a case starts from it)."""

    def __post_init__(self) -> None:
        _check_literal("mode", self.mode, Mode)
        _check(len(self.prefix_lens) >= 1, "prefix_lens", self.prefix_lens, "needs a request")
        _check(
            len(self.prefix_lens) <= MAX_REQUESTS,
            "prefix_lens",
            f"{len(self.prefix_lens)} requests",
            f"at most {MAX_REQUESTS} requests",
        )
        _check_int("q_len", self.q_len, 1, MAX_Q_LEN)
        for p in self.prefix_lens:
            _check(
                _is_int(p) and 0 <= p <= MAX_SEQ_LEN - self.q_len,
                "prefix_lens",
                self.prefix_lens if len(self.prefix_lens) <= 8 else f"[{p}, ...]",
                f"each an integer in [0, {MAX_SEQ_LEN} - q_len]",
            )
        if isinstance(self.draft, TreeDraft):
            _check(
                len(self.draft.parents) == self.q_len,
                "draft.parents",
                self.draft.parents,
                f"needs one parent per draft token (q_len={self.q_len})",
            )
        _check_int("padding_requests", self.padding_requests, 0, MAX_REQUESTS)
        _check_int("padding_rows", self.padding_rows, 0, MAX_PADDING_ROWS)
        if self.spec_draft_len is not None:
            _check_int("spec_draft_len", self.spec_draft_len, self.q_len + 1, MAX_Q_LEN)
            _check(
                self.mode == "draft_extend_v2" and isinstance(self.draft, CausalDraft),
                "spec_draft_len",
                self.spec_draft_len,
                "only a chain draft's draft-extend batch has a draft length other than L",
            )
        _check(
            len(self.prefix_lens) + self.padding_requests <= MAX_REQUESTS,
            "prefix_lens",
            f"{len(self.prefix_lens)} requests + {self.padding_requests} padding",
            f"at most {MAX_REQUESTS} requests in all",
        )
        if self.q_lens is not None:
            _check_q_lens(self.q_lens, self.q_len, len(self.prefix_lens))

    @property
    def is_ragged(self) -> bool:
        return self.q_lens is not None

    def with_real_requests(
        self, prefix_lens: tuple[int, ...], q_lens: tuple[int, ...]
    ) -> BatchSpec:
        """This batch with other real requests (their prefixes and new tokens): ``L`` becomes
        the largest count (a tree draft keeps its first ``L`` tokens) and the batch is uniform
        again when every count is ``L``."""
        L = max(q_lens)
        draft = self.draft
        if isinstance(draft, TreeDraft):
            draft = TreeDraft(parents=draft.parents[:L])
        ragged = min(q_lens) < L
        return dataclasses.replace(
            self, prefix_lens=prefix_lens, q_len=L, draft=draft, q_lens=q_lens if ragged else None
        )

    @property
    def num_requests(self) -> int:
        """Requests the kernel sees: real ones plus CUDA-graph padding."""
        return len(self.prefix_lens) + self.padding_requests

    def new_tokens(self) -> tuple[int, ...]:
        """New tokens (query rows) of each request, padding ones included (``L`` each)."""
        real = self.q_lens if self.q_lens is not None else (self.q_len,) * len(self.prefix_lens)
        return real + (self.q_len,) * self.padding_requests

    def first_rows(self) -> tuple[int, ...]:
        """Each request's first query row (``b * L`` when uniform), and the row count last."""
        starts = [0]
        for n in self.new_tokens():
            starts.append(starts[-1] + n)
        return tuple(starts)

    @property
    def num_query_rows(self) -> int:
        """The rows every path must produce: ``num_requests * L``, or the sum of the
        requests' new tokens when ragged."""
        if self.q_lens is None:
            return self.num_requests * self.q_len
        return sum(self.new_tokens())

    def all_prefix_lens(self) -> tuple[int, ...]:
        return self.prefix_lens + (PADDING_PREFIX_LEN,) * self.padding_requests

    def seq_lens(self) -> tuple[int, ...]:
        """``T_b = P_b + L_b`` per request, padding included."""
        if not self._lens:
            lens = zip(self.all_prefix_lens(), self.new_tokens(), strict=True)
            self._lens.append(tuple(p + n for p, n in lens))
        return self._lens[0]


def _check_q_lens(q_lens: object, q_len: int, requests: int) -> None:
    _check(
        isinstance(q_lens, tuple) and all(_is_int(n) for n in q_lens),
        "q_lens",
        q_lens,
        "must be a list of integers",
    )
    assert isinstance(q_lens, tuple)
    shown = q_lens if len(q_lens) <= 8 else f"[{q_lens[0]}, ...] ({len(q_lens)})"
    _check(
        len(q_lens) == requests, "q_lens", shown, f"needs one count per real request ({requests})"
    )
    _check(all(1 <= n <= q_len for n in q_lens), "q_lens", shown, f"each in [1, q_len={q_len}]")
    _check(max(q_lens) == q_len, "q_lens", shown, f"the largest must be q_len={q_len}")
    _check(
        min(q_lens) < q_len,
        "q_lens",
        shown,
        "every request has q_len new tokens: that is the uniform case (leave q_lens out)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """The paged KV pool and the page table, as a serving engine's allocator leaves them."""

    kv_storage: KVStorage = "hnd"
    """``hnd``/``nhd``: one ``[pages, 2, ...]`` tensor; ``kv_split_nhd``: SGLang's per-token
    K and V buffers ``[slots, H_kv, D]`` seen through a permuted HND view."""
    page_order: PageOrder = "sequential"
    spare_pages: int = 0
    """Pool pages no request uses (they hold stale data)."""
    shared_prefix_pages: int = 0
    """Leading pages shared by every real request (a radix-cache hit)."""
    table_width: TableWidth = "exact"
    """``exact``: as many columns as the longest request needs; ``context``:
    ``ceil(context_len / page_size)`` as SGLang allocates."""
    table_fill: TableFill = "zero"
    """What fills table columns past a request's used pages."""
    stale_fill: StaleFill = "zeros"
    """What fills slots no live token occupies."""
    context_len: int | None = None
    """The model's context length (``max_seq_len`` under the SGLang convention);
    ``None`` means the longest ``T_b``."""

    def __post_init__(self) -> None:
        _check_literal("kv_storage", self.kv_storage, KVStorage)
        _check_literal("page_order", self.page_order, PageOrder)
        _check_literal("table_width", self.table_width, TableWidth)
        _check_literal("table_fill", self.table_fill, TableFill)
        _check_literal("stale_fill", self.stale_fill, StaleFill)
        _check_int("spare_pages", self.spare_pages, 0, MAX_SPARE_PAGES)
        _check_int("shared_prefix_pages", self.shared_prefix_pages, 0, MAX_SEQ_LEN)
        if self.context_len is not None:
            _check_int("context_len", self.context_len, 1, MAX_SEQ_LEN)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueSpec:
    """Which value family fills q, k, v, sinks and stale slots, and at what scale."""

    family: ValueFamily = "randn"
    scale: float = 1.0

    def __post_init__(self) -> None:
        _check_literal("values.family", self.family, ValueFamily)
        _check_scale("values.scale", self.scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One logical batch, complete: the unit that is run, compared, shrunk and replayed."""

    attention: AttentionConfig
    batch: BatchSpec
    pool: PoolSpec = field(default_factory=PoolSpec)
    values: ValueSpec = field(default_factory=ValueSpec)
    convention: Convention = "sglang"
    """How kernel adapters build their arguments: as SGLang does, or plain exact tensors."""
    seed: int = 0
    graph: GraphSpec | None = None
    """Replay the case under a CUDA graph over static buffers (:mod:`.graph_spec`); ``None``:
    eager calls only."""
    _memo: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    """:meth:`canonical_json` and :meth:`digest`, once computed (not part of the case: no
    argument, no JSON key)."""
    _pages: list[tuple[int, ...]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )
    """:meth:`pages_per_request`, once computed (a campaign asks about ten times a case)."""

    def __post_init__(self) -> None:
        _check_literal("convention", self.convention, Convention)
        _check(
            self.batch.spec_draft_len is None or self.convention == "sglang",
            "batch.spec_draft_len",
            self.batch.spec_draft_len,
            "is how SGLang sizes its mask buffer: it needs convention 'sglang'",
        )
        _check_int("seed", self.seed, 0, MAX_SEED - 1)
        shared_tokens = self.pool.shared_prefix_pages * self.attention.page_size
        _check(
            shared_tokens <= min(self.batch.prefix_lens),
            "pool.shared_prefix_pages",
            self.pool.shared_prefix_pages,
            f"shared pages ({shared_tokens} tokens) must lie inside every real prefix "
            f"(shortest {min(self.batch.prefix_lens)})",
        )
        # Each derived quantity once: the messages below are built whether a check fails or not.
        if self.pool.context_len is not None:
            longest = self.max_seq_len_used()
            _check(
                self.pool.context_len >= longest,
                "pool.context_len",
                self.pool.context_len,
                f"must be >= the longest sequence ({longest})",
            )

        a = self.attention
        num_pages = self.num_pages()
        pool = num_pages * a.page_size * a.num_kv_heads * a.head_dim * 2
        _check(
            pool <= MAX_POOL_ELEMENTS,
            "pool",
            f"{num_pages} pages of {a.page_size} x {a.num_kv_heads} x {a.head_dim}",
            f"the K/V pool would hold {pool} elements, more than {MAX_POOL_ELEMENTS}",
        )
        rows = self.batch.num_query_rows + self.batch.padding_rows
        queries = rows * a.num_qo_heads * a.head_dim
        _check(
            queries <= MAX_QUERY_ELEMENTS,
            "batch",
            f"{rows} query rows of {a.num_qo_heads} x {a.head_dim}",
            f"{queries} query elements, more than {MAX_QUERY_ELEMENTS}",
        )
        work = self.work()
        _check(
            work <= MAX_WORK,
            "batch",
            f"{self.total_kv_tokens()} KV tokens",
            f"{work} multiply-adds, more than {MAX_WORK}",
        )
        if self.graph is not None:
            self._check_graph(self.graph)

    def _check_graph(self, g: GraphSpec) -> None:
        """A graph replay needs SGLang's buffers (the static table is passed whole, with its
        stale columns) and a uniform ``L`` (SGLang pads ragged batches to ``L`` under CUDA
        graphs); the static buffers must fit the caps."""
        _check(
            self.convention == "sglang",
            "graph",
            self.convention,
            "a CUDA-graph replay passes the static buffers as SGLang does: convention 'sglang'",
        )
        _check(
            not self.batch.is_ragged,
            "graph",
            "q_lens",
            "a CUDA-graph replay has a uniform L (SGLang pads ragged batches under graphs)",
        )
        L = self.batch.q_len
        _check(
            g.extra_requests * L >= self.batch.padding_rows,
            "graph.extra_requests",
            g.extra_requests,
            f"the {self.batch.padding_rows} padding rows must fit in the static query rows "
            f"past the requests' ({g.extra_requests} x L={L})",
        )
        a = self.attention
        pages = self.num_pages() + g.extra_pages
        _check(
            pages * a.page_size * a.num_kv_heads * a.head_dim * 2 <= MAX_POOL_ELEMENTS,
            "graph.extra_pages",
            g.extra_pages,
            f"a static pool of {pages} pages would hold more than {MAX_POOL_ELEMENTS} elements",
        )
        requests = self.batch.num_requests + g.extra_requests
        _check(
            requests * (self.table_width() + g.extra_columns) <= MAX_QUERY_ELEMENTS,
            "graph.extra_columns",
            g.extra_columns,
            f"a static page table of {requests} rows would hold more than "
            f"{MAX_QUERY_ELEMENTS} entries",
        )
        _check(
            requests * L * a.num_qo_heads * a.head_dim <= MAX_QUERY_ELEMENTS,
            "graph.extra_requests",
            g.extra_requests,
            f"static query rows for {requests} requests: more than {MAX_QUERY_ELEMENTS} elements",
        )
        _check(
            requests <= MAX_REQUESTS,
            "graph.extra_requests",
            g.extra_requests,
            f"at most {MAX_REQUESTS} static requests",
        )
        _check(
            self.graph_max_seq_len() <= MAX_SEQ_LEN,
            "graph.extra_max_seq_len",
            g.extra_max_seq_len,
            f"the captured max_seq_len must be at most {MAX_SEQ_LEN}",
        )

    def graph_max_seq_len(self) -> int:
        """The host ``max_seq_len`` a graph replay runs with: the context length (SGLang's
        ``max_seq_len``) plus the graph's extra."""
        extra = self.graph.extra_max_seq_len if self.graph is not None else 0
        return self.context_len() + extra

    def pool_elements(self) -> int:
        """K and V elements of the whole pool."""
        a = self.attention
        return self.num_pages() * a.page_size * a.num_kv_heads * a.head_dim * 2

    def estimated_bytes(self) -> int:
        """A generous estimate of the memory materialising and judging the case takes."""
        a = self.attention
        return estimated_bytes(
            self.pool_elements(),
            self.total_kv_tokens(),
            self.batch.num_query_rows + self.batch.padding_rows,
            a.num_qo_heads,
            a.head_dim,
        )

    # -- derived quantities -------------------------------------------------------------------

    def max_seq_len_used(self) -> int:
        return max(self.batch.seq_lens())

    def context_len(self) -> int:
        return self.pool.context_len or self.max_seq_len_used()

    def pages_per_request(self) -> tuple[int, ...]:
        if not self._pages:
            ps = self.attention.page_size
            self._pages.append(tuple(-(-t // ps) for t in self.batch.seq_lens()))
        return self._pages[0]

    def table_width(self) -> int:
        used = max(self.pages_per_request())
        if self.pool.table_width == "exact":
            return used
        return max(used, -(-self.context_len() // self.attention.page_size))

    def used_pages(self) -> int:
        """Distinct pages the requests occupy (shared prefix pages counted once)."""
        shared = self.pool.shared_prefix_pages
        real = len(self.batch.prefix_lens)
        return sum(self.pages_per_request()) - shared * (real - 1) if real else 0

    def num_pages(self) -> int:
        return self.used_pages() + self.pool.spare_pages

    def total_kv_tokens(self) -> int:
        return sum(self.batch.seq_lens())

    def size(self) -> int:
        """A rough measure of how big the case is (for shrink reports and deadlines)."""
        a = self.attention
        return self.batch.num_query_rows * a.num_qo_heads * a.head_dim + self.total_kv_tokens() * (
            a.num_kv_heads * a.head_dim
        )

    def work(self) -> int:
        """Multiply-adds the attention needs (for deadlines and throughput; with ragged
        requests, an upper bound)."""
        a = self.attention
        return self.total_kv_tokens() * self.batch.q_len * a.num_qo_heads * a.head_dim * 2

    def compile_variant(self) -> tuple[object, ...]:
        """What a kernel library may build (JIT) or select a separate module for: everything
        but the runtime arguments (lengths, page table, scales, values, the mode's bookkeeping).
        The first case of a variant pays the compile."""
        a = self.attention
        return (
            a.q_dtype,
            a.kv_dtype,
            a.out_dtype,
            a.head_dim,
            a.page_size,
            a.num_qo_heads,
            a.num_kv_heads,
            a.window_left >= 0,
            a.sinks,
            self.batch.q_len,
            self.batch.draft.kind,
            self.pool.kv_storage,
            *_mode_variant(self),
        )

    # -- serialisation ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        data = _to_plain(self)
        written = set(data) | ({"graph"} if self.graph is None else set())
        assert written == set(_field_names(Case)), "a field was forgotten"
        return {"format": CASE_FORMAT, **data}

    @classmethod
    def from_json(cls, data: Any, *, source: str = "case") -> Case:
        if not isinstance(data, dict):
            raise FormatError(source, f"a case must be a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != CASE_FORMAT:
            raise FormatError(source, f"unknown case format {shown(fmt)}, expected {CASE_FORMAT!r}")
        body = {k: v for k, v in data.items() if k != "format"}
        try:
            case: Case = _from_plain(cls, body, "case")
            return case
        except InvalidCase as e:
            raise FormatError(source, str(e)) from None

    def canonical_json(self) -> str:
        """The case as compact JSON with sorted keys: what :meth:`digest` hashes, and what a
        campaign writes ahead and sends its isolated workers. Computed once per object (the
        case is frozen; a campaign needs it three times a case)."""
        if not self._memo:
            self._memo.append(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")))
        return self._memo[0]

    def digest(self) -> str:
        """A short content hash: the identity of the case (repro file names use it). Computed
        once per object: a campaign asks for it several times a case (the plan, the isolated
        executor, the report)."""
        if len(self._memo) < 2:
            self._memo.append(hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16])
        return self._memo[1]

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)


def _mode_variant(case: Case) -> tuple[object, ...]:
    """What the production modes add to a compile variant, only when they are on (so the
    variants of other cases are what they always were): ragged queries (XQA builds another
    module for them) and the skip-softmax factor."""
    extra: tuple[object, ...] = ()
    if case.batch.is_ragged:
        extra += ("ragged",)
    if case.attention.skip_softmax_threshold_scale_factor is not None:
        extra += ("skip_softmax",)
    return extra


OMITTED_WHEN_NONE = frozenset(
    {"q_lens", "skip_softmax_threshold_scale_factor", "graph", "spec_draft_len"}
)
"""Fields added after format 1 was fixed (the production modes, SGLang's draft length), left
out of the JSON when unset: a case that uses none of them has the JSON, and so the digest, it
had before they existed."""


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_SCALARS = (int, float, str, bool)


def _field_names(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` that are part of what it describes: its constructor's
    arguments (a memo such as :attr:`Case._memo` is not), looked up once per class."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return names


def _to_plain(obj: Any) -> Any:
    """``obj`` as JSON-ready data: dataclasses as dicts (their unset late fields left out),
    tuples as lists. Called for every digest, so a tuple of scalars (a batch's lengths, up
    to hundreds) is copied at once and each class's field names are looked up once."""
    names = _FIELD_NAMES.get(type(obj))
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _field_names(type(obj))
    if names is not None:
        return {
            name: value if type(value) in _SCALARS else _to_plain(value)
            for name in names
            if (value := getattr(obj, name)) is not None or name not in OMITTED_WHEN_NONE
        }
    if isinstance(obj, tuple):
        if all(type(x) in _SCALARS for x in obj):
            return list(obj)
        return [_to_plain(x) for x in obj]
    return obj


_NESTED: dict[str, type] = {
    "attention": AttentionConfig,
    "batch": BatchSpec,
    "pool": PoolSpec,
    "values": ValueSpec,
    "graph": GraphSpec,
}
_TUPLE_FIELDS = {"prefix_lens", "parents", "q_lens"}
_MAX_TUPLE = max(MAX_REQUESTS, MAX_Q_LEN)
"""No list in a case is longer (prefix and query lengths: one per request; parents: one per
token)."""


def _from_plain(cls: type, body: Any, where: str) -> Any:
    if not isinstance(body, dict):
        raise InvalidCase(where, body, "must be a JSON object")
    names = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise InvalidCase(where, unknown, "unknown key(s)")
    kwargs: dict[str, Any] = {}
    for key, value in body.items():
        path = f"{where}.{key}"
        if key in OMITTED_WHEN_NONE and value is None:
            pass  # written by hand: the same as leaving it out
        elif key in _NESTED and cls is Case:
            value = _from_plain(_NESTED[key], value, path)
        elif key == "draft":
            kind = value.get("kind") if isinstance(value, dict) else None
            draft_cls = {"causal": CausalDraft, "tree": TreeDraft}.get(str(kind))
            if draft_cls is None:
                raise InvalidCase(path, value, "draft kind must be 'causal' or 'tree'")
            value = _from_plain(draft_cls, value, path)
        elif key in _TUPLE_FIELDS:
            if isinstance(value, list) and len(value) > _MAX_TUPLE:  # before a look at each
                raise InvalidCase(path, value, f"more than {_MAX_TUPLE} items")
            if not isinstance(value, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in value
            ):
                raise InvalidCase(path, value, "must be a list of integers")
            value = tuple(value)
        elif isinstance(value, bool) is False and isinstance(value, float) and value.is_integer():
            # JSON writers may print 1.0 for a float field; keep floats as floats.
            value = float(value)
        kwargs[key] = value
    missing = [n for n, f in names.items() if n not in kwargs and _required(f)]
    if missing:
        raise InvalidCase(where, missing, "missing required key(s)")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise InvalidCase(where, body, str(e)) from None


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
