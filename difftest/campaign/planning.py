"""Which cases a campaign runs, in what order, so that no bug hides another.

Cases come from the generators in deterministic chunks: the same seed (and Hypothesis version)
gives the same ordered list. Each template case starts a compile variant. Hypothesis draws one
template in :attr:`CampaignConfig.hypothesis_every` (every one on a GPU), and the same builder
(:func:`~difftest.generation.strategies.template_case`) makes the others from seeded choices,
each a fresh configuration: on a CPU every case is a template, and a Hypothesis draw costs
more than the rest of the plan. With
``cases_per_variant > 1`` it is followed by runtime variations of it, and with ``pack > 1``
each of those is preceded by partners that may share its launch. On top of the generators:

- **Swarm configuration** (Groce et al., ISSTA 2012): each template holds a random half of the
  optional features (:data:`SWARM_FEATURES`) at their defaults, for all its variations. Cases
  without, say, custom scales keep arriving even while a path fails on every case that has
  them.
- **Known-trigger avoidance**: a case that has every feature of an established group's
  trigger (a known bug's, or one found in this run) is moved off it, one feature reset, except
  a fixed share (:attr:`CampaignConfig.keep_share`) that still hits it, so a fix or a
  regression stays visible. :class:`PlanStats` counts what each avoidance cost.
- **Path-aware generation**: a template none of the chosen kernel paths supports is drawn
  again (a kernel path is a ``decode`` or ``prefill`` one that can run here).
- **SGLang's draft length**: in a share of templates (:data:`DRAFT_LEN_SHARE`), every case
  SGLang could produce that way (a chain draft's draft-extend batch under its convention, ``L``
  below 8) gets a speculative draft length longer than ``L``
  (:attr:`~difftest.model.case.BatchSpec.spec_draft_len`: the XQA mask buffer is sized by it).
  Applied to the drawn cases, not inside the Hypothesis strategy, so the generated lists stay
  what they were.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from difftest.generation import rng as counter_rng
from difftest.generation.choices import SeededChoices, sample_distinct
from difftest.generation.modes import NO_MODES, Modes
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import (
    CPU_LIMITS,
    GPU_LIMITS,
    Limits,
    cases,
    partner_case,
    template_case,
    variation_case,
)
from difftest.model.caps import MAX_POOL_ELEMENTS
from difftest.model.case import Case, CausalDraft
from difftest.model.graph_spec import GraphSpec
from difftest.paths.registry import KernelPath
from difftest.triage.features import BY_NAME, feature_of_label, has, matches, reset_all
from difftest.triage.groups import KnownBug

CHUNK = 8
"""Template cases drawn per generator call; chunk ``k`` uses a seed derived from ``(seed, k)``.
The templates do not depend on ``cases_per_variant`` or ``pack``, so ``difftest warmup`` plans
the same variants a run with other settings meets."""

SWARM_FEATURES: tuple[str, ...] = (
    "window",
    "sinks",
    "kv_fp8",
    "fp16",
    "draft=tree",
    "sm_scale",
    "q_scale",
    "k_scale",
    "bmm2_scale",
    "padding_requests",
    "padding_rows",
    "page_order",
    "shared_pages",
    "spare_pages",
    "table_width=context",
    "table_fill",
    "stale_fill",
    "kv_storage",
    "convention",
    "values",
    "value_scale",
)
"""The features a swarm may hold at their defaults (flags only: sizes are not switched off)."""

AVOID_ORDER: tuple[str, ...] = (
    "bmm2_scale",
    "q_scale",
    "k_scale",
    "sm_scale",
    "value_scale",
    "values",
    "stale_fill",
    "table_fill",
    "table_width=context",
    "page_order",
    "shared_pages",
    "spare_pages",
    "padding_rows",
    "padding_requests",
    "convention",
    "kv_storage",
    "graph_scales",
    "graph_max_seq_len",
    "graph_columns",
    "graph_pages",
    "graph_requests",
)
"""Which feature of a trigger to reset to avoid it, first choice first: runtime arguments
before sizes, sizes before what a GPU compiles a module for (window, sinks, dtypes, ``L``)."""

DRAFT_LEN_SHARE = 0.25
"""The share of templates whose eligible cases get SGLang's longer draft length."""
MAX_DRAFT_LEN = 8
"""The longest speculative draft length given (``speculative_num_draft_tokens`` is 2 to 8)."""

CPU_HYPOTHESIS_EVERY = 32
"""A CPU campaign's :attr:`CampaignConfig.hypothesis_every`: there every case is a template
(a variant costs no compile), and a Hypothesis template costs 4-17 ms of the parent's CPU
against about 0.1 ms for a seeded one."""

KEEP_SHARE = 0.1
"""The share of cases that keep an avoided trigger (so a fix or regression shows)."""
MAX_DEFERRED = 256
"""Launches that may wait at once for paths whose module is still building
(:attr:`CampaignConfig.patience_s`)."""
FILL_SALT = 0xF111
"""Mixed into the seed of the extra variations a campaign runs while modules build
(:meth:`Planner.extra`): their stream is apart from the planned cases'."""
MAX_REDRAWS = 64
"""Templates in a row that no chosen kernel path supports before path-aware drawing gives up
(and lets the case through: the health check then names the path that skips most cases)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignConfig:
    seed: int = 0
    max_cases: int | None = None
    preset: str | None = None
    mode: str | None = None
    out_dir: Path = Path("difftest-out")
    limits: Limits | None = None
    """``None``: chosen by the device (smaller cases on a CPU)."""
    cases_per_variant: int = 1
    """Cases drawn per compile variant: 1 draws every case afresh (right on a CPU); on a GPU,
    where each new kernel configuration is a JIT compile, a variant's cases differ only in
    what kernels take at run time (:func:`difftest.generation.strategies.variation_case`, from
    seeded plain-Python choices: Hypothesis draws the templates only)."""
    hypothesis_every: int | None = None
    """One template in this many is drawn by Hypothesis; each is followed by
    ``hypothesis_every - 1`` fresh templates of the same builder
    (:func:`~difftest.generation.strategies.template_case`) from seeded plain-Python choices,
    every choice made afresh (compile variant included), at a fortieth of the cost. 1: every
    template from Hypothesis. ``None``: chosen by the device (:data:`CPU_HYPOTHESIS_EVERY` on
    a CPU; 1 on a GPU, whose templates are few, each a compile)."""
    max_variants: int | None = None
    """Stop after this many compile variants (bounds JIT compile time on a GPU)."""
    pack: int = 1
    """Cases per kernel launch: each drawn case comes with ``pack - 1`` partners that may
    share its launch (:func:`difftest.generation.strategies.partner_case`, seeded plain-Python
    choices), and every path
    runs them in one launch (:mod:`difftest.execution.packing`); a case not AGREE there is
    rerun alone."""
    determinism_every: int = 16
    """Rerun every N-th case to check bitwise determinism (0: never)."""
    swarm: bool = True
    avoid: bool = True
    """Avoid the triggers of established groups (known bugs and this run's)."""
    keep_share: float = KEEP_SHARE
    path_aware: bool = True
    known: tuple[KnownBug, ...] = ()
    """Bugs the corpus has: their groups exist from the start, labelled KNOWN."""
    shrink: bool = True
    shrink_runs: int = 250
    """Runs one shrink of a group may take (the ablation after it takes a few more)."""
    shrink_seconds: float = 120.0
    """Seconds one shrink may take (and never past the session's budget)."""
    modes: Modes = NO_MODES
    """The production modes drawn cases use (ragged verify, skip-softmax, graph replay); a
    graph campaign's cases of one variant share one static shape (:func:`share_graph`)."""
    compile_ahead: int = 0
    """Build the next compile variants' modules in this many spawned processes while the
    current variant's cases run (:mod:`difftest.execution.compile_ahead`); 0: build on first
    use."""
    fill: bool = False
    """With :attr:`compile_ahead`: while the next launch's modules build, run more runtime
    variations of the variants whose modules are built (:meth:`Planner.extra`), so the device
    works while the compilers do; the run's case list then depends on how long builds take
    (the command line turns it on only for runs bounded by their budget alone)."""
    patience_s: float = 10.0
    """With :attr:`compile_ahead`: seconds a build is waited for, from when a launch first
    needs it; past that, launches run on the paths that are ready, and the paths still
    building judge them once their module exists (at most :data:`MAX_DEFERRED` launches
    wait so; past that, launches wait as before)."""
    workers: int = 1
    """Launches running at once, each in its own executor
    (:class:`~difftest.execution.parallel.LaunchPool`); 1: one at a time, each started before
    the one ahead of it is accounted for (:class:`~difftest.execution.parallel.BackgroundLaunch`),
    so a trigger established on launch ``j`` is avoided from launch ``j + 2``. With more, the
    cases of launch ``k`` are planned before the ``workers - 1`` launches ahead of it are
    judged, so a trigger established on launch ``j`` is avoided from launch ``j + workers``.
    Every verdict is the one the case gets alone."""


@dataclass(slots=True)
class PlanStats:
    """What the planning did to the drawn cases."""

    drawn: int = 0
    avoided: Counter[tuple[str, ...]] = field(default_factory=Counter)
    """Cases moved off each trigger."""
    kept: Counter[tuple[str, ...]] = field(default_factory=Counter)
    """Cases that kept an avoided trigger (the fixed share)."""
    swarm_held: Counter[str] = field(default_factory=Counter)
    """Templates that held each feature at its default."""
    unsupported_redrawn: int = 0
    """Templates drawn again because no chosen kernel path supports them."""


def case_seed(seed: int, chunk: int) -> int:
    key = counter_rng.key(seed, counter_rng.Stream.CASE_SEED)
    return counter_rng.hash_ints(key, chunk) & (2**32 - 1)


def _coin(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    text = "|".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


@functools.lru_cache(maxsize=256)
def swarm_mask(seed: int, template: int) -> frozenset[str]:
    """The features template ``template`` of the campaign of ``seed`` holds at default
    (cached: the planner asks for a template's mask twice)."""
    return frozenset(f for f in SWARM_FEATURES if _coin("swarm", seed, template, f) < 0.5)


def hold(case: Case, features: frozenset[str]) -> Case:
    """``case`` with ``features`` at their defaults (where the case model allows it)."""
    out = case
    for name in SWARM_FEATURES:
        if name not in features:
            continue
        feature = BY_NAME[name]
        if feature.label(out) is not None:
            moved = feature.reset_case(out)
            out = moved if moved is not None else out
    return out


def with_draft_length(case: Case, seed: int, template: int) -> Case:
    """``case`` with SGLang's speculative draft length longer than ``L``, when template
    ``template`` of the campaign of ``seed`` is one of the :data:`DRAFT_LEN_SHARE` that get
    it and SGLang can produce the case that way (else ``case``)."""
    b = case.batch
    eligible = (
        case.convention == "sglang"
        and b.mode == "draft_extend_v2"
        and isinstance(b.draft, CausalDraft)
        and b.q_len < MAX_DRAFT_LEN
        and b.spec_draft_len is None
    )
    if not eligible or _coin("draft_len", seed, template) >= DRAFT_LEN_SHARE:
        return case
    extra = int(_coin("draft_len_extra", seed, template) * (MAX_DRAFT_LEN - b.q_len))
    return case.replace(batch=dataclasses.replace(b, spec_draft_len=b.q_len + 1 + extra))


def avoid(
    case: Case,
    triggers: Sequence[tuple[str, ...]],
    keep_share: float,
    stats: PlanStats | None = None,
) -> Case:
    """``case`` moved off every trigger it has, but for the ``keep_share`` that keep it."""
    out = case
    for trigger in triggers:
        if not trigger or not matches(out, trigger):
            continue
        if _coin("keep", case.digest(), *trigger) < keep_share:
            if stats is not None:
                stats.kept[trigger] += 1
            continue
        moved = _break(out, trigger)
        if moved is not None:
            out = moved
            if stats is not None:
                stats.avoided[trigger] += 1
    return out


def _break(case: Case, trigger: tuple[str, ...]) -> Case | None:
    """``case`` without one feature of ``trigger``: the first in :data:`AVOID_ORDER`, else a
    size, else anything."""

    def rank(label: str) -> tuple[int, int]:
        feature = feature_of_label(label)
        name = feature.name if feature else label
        if name in AVOID_ORDER:
            return (0, AVOID_ORDER.index(name))
        return (1 if feature is not None and feature.kind == "size" else 2, 0)

    for label in sorted(trigger, key=rank):
        moved = reset_all(case, (label,))
        if moved is not None and not has(moved, label):
            return moved
    return None


class Planner:
    """The campaign's cases (see the module docstring), as ``(index, case)`` without end.

    ``triggers``: asked before each case, the triggers to avoid now. ``paths``/``device``:
    for path-aware drawing.
    """

    def __init__(
        self,
        config: CampaignConfig,
        device: torch.device,
        *,
        paths: Sequence[KernelPath] = (),
        triggers: Callable[[], Sequence[tuple[str, ...]]] = lambda: (),
    ) -> None:
        self.config = config
        self.device = device
        self.limits = config.limits or (GPU_LIMITS if device.type == "cuda" else CPU_LIMITS)
        self.hypothesis_every = config.hypothesis_every or (
            1 if device.type == "cuda" else CPU_HYPOTHESIS_EVERY
        )
        self.kernels = [
            p for p in paths if p.side in ("decode", "prefill") and p.availability(device) is None
        ]
        self.triggers = triggers
        self.stats = PlanStats()
        self._templates: Iterator[tuple[int, Case]] | None = None
        self._peeked: deque[tuple[int, Case]] = deque()
        self._started = 0
        """Templates :meth:`__iter__` has begun to expand."""
        self._variants: dict[tuple[object, ...], tuple[int, Case]] = {}
        """Each compile variant :meth:`__iter__` has given a case of: the number and the
        template of that case's template (for :meth:`extra`)."""

    def _supported(self, case: Case) -> bool:
        if not self.config.path_aware or not self.kernels:
            return True
        return any(p.support(case, self.device) is None for p in self.kernels)

    def _shaped(self, case: Case, mask: frozenset[str], template: int, *, held: bool) -> Case:
        """``case`` with its template's swarm mask (unless ``held`` already: a template is
        held once, in :meth:`templates`), its draft length and avoidance applied."""
        out = hold(case, mask) if self.config.swarm and not held else case
        out = with_draft_length(out, self.config.seed, template)
        if self.config.avoid:
            out = avoid(out, self.triggers(), self.config.keep_share, self.stats)
        return out

    def templates(self) -> Iterator[tuple[int, Case]]:
        """``(template number, template)``: the compile variants in order, swarm and
        path-aware applied (avoidance is applied per case)."""
        config = self.config
        strategy = cases(
            preset=config.preset, mode=config.mode, limits=self.limits, modes=config.modes
        )
        every = max(1, self.hypothesis_every)
        seeded = functools.partial(
            template_case,
            preset=config.preset,
            mode=config.mode,
            limits=self.limits,
            modes=config.modes,
        )
        redraws = 0
        for chunk in range(1 << 30):
            drawn = sample_cases(strategy, seed=case_seed(config.seed, chunk), count=CHUNK)
            for n, first in enumerate(drawn):
                place = chunk * CHUNK + n
                choices = SeededChoices(case_seed(config.seed ^ 0x7E3F, place))
                for k in range(every):
                    number = place * every + k
                    if config.max_variants is not None and number >= config.max_variants:
                        return
                    template = first if k == 0 else seeded(choices)
                    mask = swarm_mask(config.seed, number) if config.swarm else frozenset()
                    held = hold(template, mask) if mask else template
                    if not self._supported(held) and redraws < MAX_REDRAWS:
                        redraws += 1
                        self.stats.unsupported_redrawn += 1
                        continue
                    redraws = 0
                    yield number, held

    def upcoming(self, count: int) -> list[Case]:
        """The next ``count`` templates :meth:`__iter__` will expand, drawn now if need be
        (what compile-ahead builds for; avoidance, applied per case later, may still move a
        case to another variant). With a case limit, none past the templates the limit can
        need (each gives at most ``cases_per_variant * pack`` cases): a build for a variant
        the run never reaches only loads the machine (on the H200, a 200-case run's look-ahead
        started four build processes that never finished, and the run took 4-6 s longer
        than with no compile-ahead, docs/validation.md Run 21)."""
        config = self.config
        if config.max_cases is not None:
            per_template = max(1, config.cases_per_variant) * max(1, config.pack)
            needed = -(-config.max_cases // per_template)
            count = min(count, max(0, needed - self._started))
        if self._templates is None:
            self._templates = self.templates()
        while len(self._peeked) < count:
            item = next(self._templates, None)
            if item is None:
                break
            self._peeked.append(item)
        return [template for _, template in itertools.islice(self._peeked, count)]

    def _next_template(self) -> tuple[int, Case] | None:
        if self._peeked:
            item: tuple[int, Case] | None = self._peeked.popleft()
        else:
            if self._templates is None:
                self._templates = self.templates()
            item = next(self._templates, None)
        self._started += item is not None
        return item

    def __iter__(self) -> Iterator[tuple[int, Case]]:
        config = self.config
        index = 0
        seen: set[str] = set()  # separate generator calls may draw one case twice: run it once
        per_variant = max(1, config.cases_per_variant)
        while (item := self._next_template()) is not None:
            number, template = item
            mask = swarm_mask(config.seed, number) if config.swarm else frozenset()
            self.stats.swarm_held.update(mask)
            group = [template]
            if per_variant > 1:
                more = self._variations(
                    template, case_seed(config.seed ^ 0x5EED, number), per_variant
                )
                group += [c for c in more if c != template][: per_variant - 1]
            if config.modes.graph:  # shaped first, so that they can share one static shape
                group = share_graph(
                    [self._shaped(c, mask, number, held=c is template) for c in group]
                )
            for drawn in group:
                leader = (
                    drawn
                    if config.modes.graph
                    else self._shaped(drawn, mask, number, held=drawn is template)
                )
                self.stats.drawn += 1
                # a template's variations may have other compile variants (the pool layout)
                self._variants.setdefault(leader.compile_variant(), (number, template))
                launch = self._with_partners(leader, case_seed(config.seed ^ 0x9AC4, index))
                digests = [c.digest() for c in launch]
                launch = [c for c, d in zip(launch, digests, strict=True) if d not in seen]
                if not launch:
                    continue
                seen.update(digests)
                for case in launch:
                    yield index, case
                    index += 1

    def _variations(self, template: Case, seed: int, count: int) -> list[Case]:
        """Up to ``count`` distinct runtime variations of ``template``, drawn from ``seed``."""
        config = self.config
        build = functools.partial(
            variation_case,
            template=template,
            limits=self.limits,
            mode=config.mode,
            modes=config.modes,
        )
        return sample_distinct(build, Case.digest, seed=seed, count=count)

    def _with_partners(self, leader: Case, seed: int) -> list[Case]:
        """``leader``'s launch: its ``pack - 1`` partners (drawn from ``seed``), then it."""
        per_launch = max(1, self.config.pack)
        if per_launch == 1:
            return [leader]
        more = sample_distinct(
            functools.partial(
                partner_case, template=leader, limits=self.limits, mode=self.config.mode
            ),
            Case.digest,
            seed=seed,
            count=per_launch - 1,
        )
        return [*[c for c in more if c != leader][: per_launch - 1], leader]

    def extra(self, case: Case, k: int) -> list[Case]:
        """Launch ``k`` (0, 1, ...) of the extra runtime variations of ``case``'s compile
        variant, beyond the ``cases_per_variant`` :meth:`__iter__` gave it: a leader drawn
        from its own seeded stream (the campaign's seed, the template's number, ``k``), shaped
        like the others (swarm mask, draft length, avoidance), with its partners. What a
        campaign runs while the next variants' modules build
        (:attr:`CampaignConfig.fill`). A variation may have another compile variant than
        ``case`` (the pool's layout varies at run time too). Empty when no case this planner
        gave has ``case``'s compile variant, or in graph modes (a variant's graph cases share
        one static shape)."""
        found = self._variants.get(case.compile_variant())
        if found is None or self.config.modes.graph:
            return []
        number, template = found
        config = self.config
        stream = case_seed(case_seed(config.seed ^ FILL_SALT, number), k)
        drawn = self._variations(template, stream, 1)
        if not drawn:
            return []
        mask = swarm_mask(config.seed, number) if config.swarm else frozenset()
        leader = self._shaped(drawn[0], mask, number, held=False)
        return self._with_partners(leader, case_seed(stream, 1))


def share_graph(group: Sequence[Case]) -> list[Case]:
    """A variant's graph cases with one static shape (the largest batch, table and pool of
    them), one captured ``max_seq_len`` (the longest) and one seed for what earlier batches
    left, as an engine's buffers for one variant are: each case's extras are what its own
    sizes leave of those. Cases without a graph are left as they are."""
    graphed = [c for c in group if c.graph is not None]
    if not graphed:
        return list(group)
    requests = max(c.batch.num_requests + _g(c).extra_requests for c in graphed)
    columns = max(c.table_width() + _g(c).extra_columns for c in graphed)
    pages = max(c.num_pages() + _g(c).extra_pages for c in graphed)
    a = graphed[0].attention  # one variant: one page size, head count and head dim
    fits = MAX_POOL_ELEMENTS // (a.page_size * a.num_kv_heads * a.head_dim * 2)
    pages = min(pages, fits)  # a variant's largest pool, as far as a pool may be large
    longest = max(c.graph_max_seq_len() for c in graphed)
    seed = _g(graphed[0]).seed
    out = []
    for c in group:
        if c.graph is None:
            out.append(c)
            continue
        shared = dataclasses.replace(
            c.graph,
            extra_requests=requests - c.batch.num_requests,
            extra_columns=columns - c.table_width(),
            extra_pages=max(0, pages - c.num_pages()),
            extra_max_seq_len=longest - c.context_len(),
            seed=seed,
        )
        out.append(c.replace(graph=shared))
    return out


def _g(case: Case) -> GraphSpec:
    assert case.graph is not None
    return case.graph


def known_triggers(known: Sequence[KnownBug], paths: Sequence[KernelPath]) -> list[tuple[str, ...]]:
    """The distinct triggers of the known bugs of ``paths``: what a campaign avoids from its
    first case (it adds its own groups' as it establishes them). A known bug of a path that
    does not run is no reason to draw fewer cases with its features."""
    active = {p.name for p in paths}
    return list(dict.fromkeys(k.trigger for k in known if k.trigger and k.path in active))


def planned_cases(
    config: CampaignConfig,
    device: torch.device | str,
    *,
    paths: Sequence[KernelPath] = (),
) -> Iterator[tuple[int, Case]]:
    """``(index, case)`` in campaign order, without end and without avoidance (what warmup
    and the shard plans read; a campaign's own planner also avoids triggers as it learns)."""
    return iter(Planner(config, torch.device(device), paths=paths))
