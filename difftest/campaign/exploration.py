"""What both exploration loops (:mod:`~difftest.campaign.sequential`, one launch at a time,
and :mod:`~difftest.campaign.pooled`, several at once) share: whether a further launch may
start, a launch's beginning (its cases, its write-ahead entry, its builds waited for), and a
judged launch's acceptance (counted, triaged, recorded, then the waiting groups shrunk), and
why the exploration stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from difftest.campaign.ahead import BuildWaits
from difftest.campaign.filling import Filler
from difftest.campaign.keeping import Keeper
from difftest.campaign.planning import CampaignConfig
from difftest.campaign.report import Tally
from difftest.campaign.shrinking import ShrinkScheduler
from difftest.execution.built_modules import BuildKey
from difftest.execution.launches import Judged
from difftest.execution.session import Session
from difftest.model.case import Case
from difftest.records.run_dir import RunDirectory
from difftest.triage.groups import Triage

Progress = Callable[[int, int, int, float], None]
"""``progress(cases, findings, groups, elapsed_s)`` after each launch."""
StopWhen = Callable[[Triage], bool]
"""``stop_when(triage)``, after each launch: ``True`` ends the exploration (the self-test stops
once the groups it looks for are established)."""


@dataclass(slots=True)
class Exploration:
    """One campaign's exploration: the pieces a launch goes through, and how it ended."""

    config: CampaignConfig
    session: Session
    out: RunDirectory
    triage: Triage
    tally: Tally
    keeper: Keeper
    shrinker: ShrinkScheduler
    builds: BuildWaits | None = None
    """With ``CampaignConfig.compile_ahead``: the builds launches wait for, and the launches
    judged later."""
    filler: Filler | None = None
    """With :attr:`builds`, ``CampaignConfig.fill``, the planner's cases (not a fixed list)
    and one launch at a time: the extra variations run while the next launch's modules
    build."""
    max_pool_bytes: int | None = None
    """The most bytes a launch's pool may take (``Session.launch_pool_bytes``; ``None``: no
    bound): the planned launches are split by it, and so are the extra ones."""
    stop_reason: str = ""
    found: bool = False
    """``stop_when`` ended the exploration."""

    def no_further_launch(self, cases: int) -> str | None:
        """Why no launch may start after ``cases`` cases (``None``: one may)."""
        config = self.config
        if config.max_cases is not None and cases >= config.max_cases:
            return f"{config.max_cases} cases run"
        waiting = config.shrink and self.triage.next_to_shrink(exploring=True) is not None
        return self.session.should_stop(shrinking_pending=waiting)

    def begin(
        self, group: list[tuple[int, Case]], cases_before: int, *, extra: bool = False
    ) -> tuple[list[Case], int, bool, list[BuildKey]]:
        """A launch about to start, after ``cases_before`` cases: its cases (cut to the case
        limit), its write-ahead entry, whether it checks determinism, and the paths that
        judge it later, as the builds they wait for (still going past the patience; one
        launch at a time only); its compile variants' builds waited for. ``extra``: a
        launch of extra variations (their indices are not the plan's: the determinism check
        counts them apart)."""
        config = self.config
        if config.max_cases is not None:
            group = group[: config.max_cases - cases_before]
        cases = [case for _, case in group]
        clock = time.perf_counter()
        token = self.out.begin(cases)
        self.tally.timings["record"] += time.perf_counter() - clock
        every = config.determinism_every
        filled = self.filler.filled if self.filler is not None else 0
        indices = (
            list(range(filled, filled + len(cases))) if extra else [index for index, _ in group]
        )
        check = bool(every) and any(index % every == 0 for index in indices)
        held: list[BuildKey] = []
        if self.builds is not None:
            held = self.builds.compile_ahead(cases, patient=self.config.workers == 1)
        return cases, token, check, held

    def accept(
        self,
        judged: list[Judged],
        token: int,
        progress: Progress | None,
        stop_when: StopWhen | None,
        start: float,
    ) -> bool:
        """Count, triage and record a judged launch, then shrink what waits; ``True`` when
        ``stop_when`` ends the exploration."""
        self.tally.add_launch(judged)
        if any(j.result.findings() or j.packed_only for j in judged):
            # triage reruns cases on the executor: first the launch running there ends (the
            # worker's time, counted in its phases, not in this launch's triage or record)
            self.session.drain()
        clock = time.perf_counter()
        timings = self.tally.timings
        rechecks = timings.get("triage", 0.0) + timings.get("compile", 0.0)
        self.keeper.keep_launch(judged)
        self.out.end(token)
        # triage's reruns inside keep() are counted as triage (or compile), not again as record
        rechecks = timings.get("triage", 0.0) + timings.get("compile", 0.0) - rechecks
        self.tally.timings["record"] += time.perf_counter() - clock - rechecks
        self.shrinker.shrink_waiting(final=False)
        if stop_when is not None and stop_when(self.triage):
            self.stop_reason = "the campaign found what it was looking for"
            self.found = True
            return True
        if progress is not None:
            progress(
                self.tally.cases,
                len(self.tally.findings),
                len(self.triage.live()),
                time.monotonic() - start,
            )
        return False
