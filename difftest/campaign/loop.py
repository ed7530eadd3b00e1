"""The campaign: draw cases, run them through the session, triage every finding into its
group, shrink each group to its minimal case, and keep everything found.

One wall clock bounds all of it (the session's :class:`~difftest.execution.session.Budget`):
cases are drawn and run while the budget allows; a group waiting for its shrink is shrunk as
soon as it appears (so its trigger can be avoided from then on) as long as shrinking has used
less than its share of the budget; once no further case may start, what is left of the budget
goes to the groups still waiting, fewest shrinks first. A known bug that its corpus entry
expects here is not shrunk while cases are drawn (its entry holds the minimal repro), only with
what is left at the end. One launch at a time runs while the one before it is accounted
for, triaged and recorded (:class:`~difftest.execution.parallel.BackgroundLaunch`: with an
isolated worker the parent's work hides behind the worker's). A launch cut off by the end of
the budget is left unjudged; an interrupt stops after the launch in flight (a second abandons
it).

Every finding is appended to ``findings.jsonl`` as it is found, every group's representative
repro is written as soon as the group exists and rewritten once shrunk
(:mod:`difftest.records.run_dir`), so a killed campaign loses nothing.

This module assembles the pieces, each in its own module (each imports only those listed
after it):

- :mod:`~difftest.campaign.sequential` (one launch at a time, the next begun behind the last)
  and :mod:`~difftest.campaign.pooled` (several at once): the exploration loops;
- :mod:`~difftest.campaign.exploration`: what both loops share: whether a launch may start, a
  launch begun, a judged launch accepted;
- :mod:`~difftest.campaign.ahead`: the builds a launch waits for (compile-ahead), the launches
  judged later for want of a module, the lookahead over a fixed case list;
  :mod:`~difftest.campaign.filling`: extra variations run while modules build;
  :mod:`~difftest.campaign.shrinking`: which group is shrunk, when;
- :mod:`~difftest.campaign.keeping`: findings triaged and logged, their groups' repros
  written.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from difftest.campaign.ahead import BuildWaits, Lookahead
from difftest.campaign.exploration import Exploration, Progress, StopWhen
from difftest.campaign.filling import Filler
from difftest.campaign.keeping import Keeper
from difftest.campaign.planning import CampaignConfig, Planner, PlanStats
from difftest.campaign.pooled import MAX_UNJUDGED, explore_pooled
from difftest.campaign.report import CampaignReport, Tally
from difftest.campaign.sequential import SequentialLoop
from difftest.campaign.shrinking import ShrinkScheduler
from difftest.execution import packing
from difftest.execution.built_modules import flashinfer_ledger
from difftest.execution.compile_ahead import CompileAhead
from difftest.execution.health import PathUse, check_health
from difftest.execution.interrupts import interruptible
from difftest.execution.session import BUDGET_SPENT, Session
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.records.run_dir import RunDirectory
from difftest.triage.groups import Triage

__all__ = ["MAX_UNJUDGED", "Progress", "StopWhen", "run_campaign"]


def run_campaign(
    config: CampaignConfig,
    session: Session,
    *,
    progress: Progress | None = None,
    cases: Iterator[tuple[int, Case]] | None = None,
    suppress: tuple[str, ...] = (),
    stop_when: StopWhen | None = None,
    plan: PlanStats | None = None,
) -> CampaignReport:
    """Run cases until the case limit, the case list, the budget or an interrupt ends it;
    shrink and triage the findings; return the report. ``cases``: a fixed case list instead
    of the planner's (the suite's shards, bench's drawn-ahead cases); ``plan``: the
    statistics of the planner that drew them (what it avoided), for the report."""
    start = time.monotonic()
    session.spawn_early(config.workers)  # its start-up overlaps the planning below
    out = RunDirectory(config.out_dir)
    died = out.open()
    triage = Triage(config.known)
    tally = Tally(config=config, jit=session.device.type == "cuda")
    keeper = Keeper(config=config, session=session, out=out, triage=triage, tally=tally)
    active = {p.name for p in session.runnable}
    planner = Planner(
        config,
        session.device,
        paths=session.runnable,
        triggers=lambda: triage.triggers_to_avoid(active),
    )
    fixed = Lookahead(cases) if cases is not None else None
    source = _timed(fixed if fixed is not None else iter(planner), tally)
    max_pool_bytes = session.launch_pool_bytes(config.workers)
    launches = packing.group_for_launches(
        source, max(1, config.pack), case_of=lambda x: x[1], max_pool_bytes=max_pool_bytes
    )
    builds: BuildWaits | None = None
    filler: Filler | None = None
    if config.compile_ahead > 0 and session.runnable:
        depth = 2 * config.compile_ahead
        ahead = CompileAhead(
            session.runnable,
            session.device,
            config.compile_ahead,
            plugins=tuple(session.settings.plugins),
            built=flashinfer_ledger() if session.device.type == "cuda" else None,
        )
        builds = BuildWaits(
            config=config,
            session=session,
            out=out,
            triage=triage,
            tally=tally,
            keeper=keeper,
            ahead=ahead,
            upcoming=(
                (lambda: fixed.variants(depth)) if fixed else (lambda: planner.upcoming(depth))
            ),
        )
        if config.fill and fixed is None:
            filler = Filler(ahead=ahead, extra=planner.extra, tally=tally)
    shrinker = ShrinkScheduler(
        config=config,
        session=session,
        triage=triage,
        tally=tally,
        keeper=keeper,
        ahead=builds.ahead if builds is not None else None,
    )
    exploration = Exploration(
        config=config,
        session=session,
        out=out,
        triage=triage,
        tally=tally,
        keeper=keeper,
        shrinker=shrinker,
        builds=builds,
        filler=filler,
        max_pool_bytes=max_pool_bytes,
    )
    try:
        if session.runnable:
            interruptible(
                lambda: _explore(exploration, launches, progress, stop_when), session.interrupts
            )
        else:
            exploration.stop_reason = "no chosen path can run here"
    finally:
        filled = filler.filled if filler is not None else 0
        ahead_stats = builds.close(filled) if builds is not None else None
    if not session.interrupted:
        interruptible(lambda: shrinker.shrink_waiting(final=True), session.interrupts)
    for group in triage.groups:
        if group.members and group.repro is None:
            keeper.write_group(group)
    out.write_index(tally.cases, triage.records(tally.cases))
    wall = time.monotonic() - start
    uses = [
        PathUse(
            name=p.name,
            ran=(c := session.counters[p.name]).ran,
            skipped=c.skipped,
            skip_reasons=dict(c.skip_reasons),
            skip_seconds=c.skip_seconds,
            quarantined=session.quarantined[p.name].reason
            if p.name in session.quarantined
            else None,
            unavailable=session.unavailable.get(p.name),
        )
        for p in session.paths
    ]
    health = check_health(
        uses,
        cases=tally.cases,
        wall_s=wall,
        budget_s=session.budget.total_s,
        compile_s=tally.compile_s,
        budget_spent=exploration.stop_reason == BUDGET_SPENT,
        compile_wait_s=tally.timings.get("compile_wait", 0.0),
        suppress=suppress,
        interrupted=session.interrupted,
    )
    interrupted = session.interrupted
    final = {(m.case.digest(), m.result.path): g.id for g in triage.groups for m in g.members}
    tally.findings[:] = [
        dataclasses.replace(f, group=final.get((f.case_digest, f.path), f.group))
        for f in tally.findings
    ]
    return tally.snapshot(
        groups=triage.records(tally.cases),
        unavailable=session.unavailable,
        quarantined={n: q.reason for n, q in session.quarantined.items()},
        environment=stamp(session.device),
        wall_s=wall,
        interrupted=interrupted,
        stop_reason=f"interrupted ({session.interrupts.requested})"
        if interrupted
        else exploration.stop_reason,
        health=health,
        plan=plan if plan is not None else planner.stats,
        died=[c.digest() for c in died],
        path_names=[p.name for p in session.paths],
        compile_ahead=ahead_stats,
    )


def _explore(
    exploration: Exploration,
    launches: Iterator[list[tuple[int, Case]]],
    progress: Progress | None,
    stop_when: StopWhen | None = None,
) -> None:
    """Run launches until something stops it (one at a time, or ``workers`` at once),
    then the launches still waiting for a path's module
    (:meth:`BuildWaits.finish_deferred`)."""
    if exploration.config.workers > 1:
        explore_pooled(exploration, launches, progress, stop_when)
    else:
        SequentialLoop(exploration).explore(launches, progress, stop_when)
    if exploration.builds is not None:
        exploration.builds.finish_deferred()


def _timed(source: Iterator[tuple[int, Case]], tally: Tally) -> Iterator[tuple[int, Case]]:
    """``source``, with the time spent drawing each case counted as ``draw``."""
    while True:
        clock = time.perf_counter()
        item = next(source, None)
        tally.timings["draw"] += time.perf_counter() - clock
        if item is None:
            return
        yield item
