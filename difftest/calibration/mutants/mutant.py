"""What a mutant is: a kernel path with one injected bug, and the cases that pin the bug down.

A :class:`Mutant` carries the path's run function, the domain bug class it stands for, when it
shows (its trigger, in words), the smallest case that shows it (``minimal``, derived by hand
from the trigger and checked by the tests) and a case that does not trigger it (``harmless``:
the mutant agrees with the oracle there, which proves the bug sits where it is claimed to).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from difftest.model.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    Convention,
    DraftSpec,
    KVDtype,
    Mode,
    PoolSpec,
)
from difftest.model.outcome import Outcome
from difftest.paths.registry import KernelPath, Precision, RunFn

MUTANT_TAG = "mutant"
"""The tag every mutant path carries; ``difftest.paths.resolve(None)`` leaves such paths out."""

MIN_HEAD_DIM = 16
"""The smallest head dim in a minimal case: kernels take multiples of 16
(``docs/semantics.md`` §4), and neither the generators nor the shrinker go below it."""

WRONG = frozenset({Outcome.WRONG, Outcome.NONFINITE})


@dataclass(frozen=True, slots=True, kw_only=True)
class Mutant:
    """One injected bug, as a registrable path plus the facts the self-test measures it by."""

    name: str
    """The path name (``mutant-...``)."""
    bug_class: str
    """The class of bug in ``docs/semantics.md`` §6 it stands for."""
    bug: str
    """One line: what the implementation gets wrong."""
    trigger: str
    """One line: which cases show it."""
    run: RunFn
    minimal: Case
    """The smallest case (by :meth:`Case.size`) that shows the bug, derived by hand."""
    harmless: Case
    """A case that does not trigger the bug: the mutant agrees with the oracle on it."""
    detected_as: frozenset[Outcome] = WRONG
    """The outcomes that count as catching this bug."""
    isolated: bool = False
    """The bug kills or stalls the process: it can only be run in an isolated worker."""

    def __post_init__(self) -> None:
        if not self.name.startswith("mutant-"):
            raise ValueError(f"mutant name {self.name!r} must start with 'mutant-'")
        if not self.detected_as or not all(o.is_finding for o in self.detected_as):
            raise ValueError(f"{self.name}: detected_as must be a non-empty set of findings")

    def path(self) -> KernelPath:
        """The registrable path (tagged so that ordinary campaigns never run it)."""
        return KernelPath(
            name=self.name,
            run=self.run,
            side="custom",
            precision=_query_dtype_precision,
            description=f"MUTANT ({self.bug_class}): {self.bug}",
            tags=frozenset({MUTANT_TAG}),
        )


def _query_dtype_precision(case: Case) -> Precision:
    """As ``torch-paged-online``: probabilities rounded to the query dtype before ``P @ V``."""
    return Precision(p_dtype=case.attention.q_dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tiny:
    """Builder of the small hand-made cases the mutant modules declare.

    Defaults are the smallest case difftest generates or shrinks to: one request without
    prefix, one new token, one query and one KV head of dimension :data:`MIN_HEAD_DIM`,
    one-token pages, bf16, no window, no sinks, unit scales, the plain convention.
    """

    prefix_lens: tuple[int, ...] = (0,)
    q_len: int = 1
    heads: tuple[int, int] = (1, 1)
    head_dim: int = MIN_HEAD_DIM
    page_size: int = 1
    mode: Mode = "target_verify"
    draft: DraftSpec = field(default_factory=CausalDraft)
    padding_requests: int = 0
    padding_rows: int = 0
    window_left: int = -1
    sinks: bool = False
    kv_dtype: KVDtype = "bf16"
    k_scale: float = 1.0
    v_scale: float = 1.0
    o_scale: float = 1.0
    pool: PoolSpec = field(default_factory=PoolSpec)
    convention: Convention = "plain"
    seed: int = 0

    def case(self) -> Case:
        return Case(
            attention=AttentionConfig(
                num_qo_heads=self.heads[0],
                num_kv_heads=self.heads[1],
                head_dim=self.head_dim,
                page_size=self.page_size,
                kv_dtype=self.kv_dtype,
                window_left=self.window_left,
                sinks=self.sinks,
                k_scale=self.k_scale,
                v_scale=self.v_scale,
                o_scale=self.o_scale,
            ),
            batch=BatchSpec(
                mode=self.mode,
                prefix_lens=self.prefix_lens,
                q_len=self.q_len,
                draft=self.draft,
                padding_requests=self.padding_requests,
                padding_rows=self.padding_rows,
            ),
            pool=self.pool,
            convention=self.convention,
            seed=self.seed,
        )
