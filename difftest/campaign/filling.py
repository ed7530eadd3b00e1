"""Filling while modules build (``CampaignConfig.fill``): the extra runtime variations of the
compile variants whose modules are built (:meth:`Planner.extra`), drawn for the sequential
loop to run while the next planned launch would wait for its modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from difftest.campaign.report import Tally
from difftest.execution.compile_ahead import CompileAhead
from difftest.model.case import Case


@dataclass(slots=True)
class _FillSource:
    """A compile variant extra variations are drawn for: a planned case of it, and how many
    extra launches were drawn for it so far."""

    case: Case
    drawn: int = 0


@dataclass(slots=True)
class Filler:
    """Draws the launches of extra variations, the variants met taking turns."""

    ahead: CompileAhead
    extra: Callable[[Case, int], list[Case]]
    """Launch ``k`` of the extra runtime variations of a case's compile variant
    (:meth:`Planner.extra`)."""
    tally: Tally
    sources: dict[tuple[object, ...], _FillSource] = field(default_factory=dict)
    """Per compile variant the planned launches met, in the order met (what
    :meth:`next_extra` takes turns over)."""
    turn: int = 0
    filled: int = 0
    """Cases of extra variations run while builds went on."""

    def met(self, case: Case) -> None:
        """A planned launch ended with ``case``: its compile variant takes turns from now on
        (once met, its place in the turns stays)."""
        self.sources.setdefault(case.compile_variant(), _FillSource(case))

    def next_extra(self) -> list[Case] | None:
        """The next launch of extra variations: the variants met take turns, each only
        while every module it needs is built; ``None`` when no variant is."""
        clock = time.perf_counter()
        try:
            sources = list(self.sources.values())
            for _ in range(len(sources)):
                source = sources[self.turn % len(sources)]
                self.turn += 1
                if not self.ahead.ready([source.case]):
                    continue
                launch = self.extra(source.case, source.drawn)
                source.drawn += 1
                if launch and self.ahead.ready(launch):  # avoidance may move a case off it
                    return launch
            return None
        finally:
            self.tally.timings["draw"] += time.perf_counter() - clock
