"""Run profiles: how much to run and how reproducibly, named for where it runs.

``dev`` gives fast feedback on a workstation, ``ci`` is derandomised (a fixed seed and a case
count, never a wall-clock budget, so the case list is identical run to run and its digest can
be compared), ``nightly`` is long and broad and explores a new seed every day. The pytest plugin
and the gate both start from a profile and let explicit options override single fields.

Pure data and standard library only: the pytest plugin imports this module for every pytest
run, so it must stay cheap.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from difftest.model.errors import DifftestError

ANY_PRESET = "any"
"""In a preset list: any configuration (generic shapes and every model preset mixed)."""
ALL_PRESETS = "all"
"""In a preset list: every model preset, one sub-campaign each."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """How much a run does and how reproducibly.

    A *sub-campaign* is one preset on one shard; ``budget_s`` bounds each of them, and
    ``max_cases`` counts the cases of one preset over all shards together, so the shards of a
    run partition exactly the cases the unsharded run would do.
    """

    name: str
    description: str
    seed: int | None
    """``None``: derived from the UTC date (a new exploration every day, replayable by date)."""
    budget_s: float | None
    """Wall-clock bound per sub-campaign; ``None``: none (``max_cases`` bounds the run)."""
    max_cases: int | None
    """Cases per preset over all shards; ``None``: as many as the budget allows."""
    shards: int
    """Shard items the pytest plugin makes (what ``pytest -n auto`` spreads over workers)."""
    presets: tuple[str, ...]
    """Preset names, :data:`ANY_PRESET` or :data:`ALL_PRESETS`."""
    corpus_replay: bool
    """Replay the regression corpus too."""
    gpu_cases_per_variant: int = 8
    """On a GPU, cases per kernel compile variant (each variant is a JIT build; its cases vary
    only runtime arguments). On a CPU every case is drawn afresh (1)."""
    determinism_every: int = 16
    """Rerun every N-th case to check bitwise determinism (0: never)."""

    def __post_init__(self) -> None:
        if self.budget_s is None and self.max_cases is None:
            raise ValueError(f"profile {self.name!r} needs a budget or a case count to stop")
        if self.shards < 1:
            raise ValueError(f"profile {self.name!r}: shards={self.shards} must be >= 1")
        if not self.presets:
            raise ValueError(f"profile {self.name!r} lists no presets")
        if self.gpu_cases_per_variant < 1:
            raise ValueError(f"profile {self.name!r}: gpu_cases_per_variant must be >= 1")

    def cases_per_variant(self, device_type: str) -> int:
        return self.gpu_cases_per_variant if device_type == "cuda" else 1

    @property
    def derandomized(self) -> bool:
        """The same case list on every run: a fixed seed and a case count, no wall clock."""
        return self.seed is not None and self.budget_s is None

    def resolved_seed(self, today: datetime.date | None = None) -> int:
        """The seed this profile runs with (today's date seed when it has none of its own)."""
        if self.seed is not None:
            return self.seed
        return date_seed(today or datetime.datetime.now(datetime.timezone.utc).date())


def date_seed(day: datetime.date) -> int:
    """A seed that names its day: 2025-06-01 -> 20250601."""
    return day.year * 10_000 + day.month * 100 + day.day


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="dev",
            description="fast feedback: a fixed seed, few cases, a short budget",
            seed=0,
            budget_s=30.0,
            max_cases=64,
            shards=4,
            presets=(ANY_PRESET,),
            corpus_replay=False,
            gpu_cases_per_variant=4,
        ),
        Profile(
            name="ci",
            description="derandomised: a fixed seed and case count, identical case lists",
            seed=0,
            budget_s=None,
            max_cases=128,
            shards=8,
            presets=(ANY_PRESET, ALL_PRESETS),
            corpus_replay=True,
        ),
        Profile(
            name="nightly",
            description="long and broad: a new seed each day, every preset, a one-hour budget",
            seed=None,
            budget_s=3600.0,
            max_cases=None,
            shards=32,
            presets=(ANY_PRESET, ALL_PRESETS),
            corpus_replay=True,
            gpu_cases_per_variant=32,
            determinism_every=4,
        ),
    )
}

DEFAULT_PROFILE = "dev"


def get_profile(name: str, source: str = "--profile") -> Profile:
    """The profile called ``name``; an unknown name is a one-line error naming ``source``."""
    try:
        return PROFILES[name]
    except KeyError:
        raise DifftestError(
            f"{source}: unknown profile {name!r}; profiles: {', '.join(PROFILES)}"
        ) from None


def expand_presets(names: tuple[str, ...], known: tuple[str, ...]) -> tuple[str | None, ...]:
    """Preset names to run, in order, without repeats: ``any`` becomes ``None`` (any
    configuration), ``all`` every name in ``known``; an unknown name is a one-line error."""
    out: list[str | None] = []
    for name in names:
        if name == ANY_PRESET:
            picked: list[str | None] = [None]
        elif name == ALL_PRESETS:
            picked = list(known)
        elif name in known:
            picked = [name]
        else:
            raise DifftestError(
                f"unknown preset {name!r}; presets: {', '.join(known)} "
                f"(or {ANY_PRESET!r}, {ALL_PRESETS!r})"
            )
        out.extend(p for p in picked if p not in out)
    return tuple(out)


def preset_label(preset: str | None) -> str:
    """How reports name a preset (``None`` is :data:`ANY_PRESET`)."""
    return ANY_PRESET if preset is None else preset
