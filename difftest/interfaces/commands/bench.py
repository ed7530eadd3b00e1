"""``difftest bench``: throughput of a campaign, per path and overall, and where time goes.

The headline is kernel time / (wall - compile). Kernel time is the libraries' calls alone: what
a path does before its call on difftest's behalf (building its arguments, layout copies and the
kernel-contract checks included, and the wrappers' plan cache) is the phase ``arguments``
(:mod:`difftest.paths.preparation`)."""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import Planner, known_triggers
from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.execution.warmup import warm_up, warm_up_in_processes
from difftest.interfaces.commands._campaign_options import (
    GPU_COMPILE_AHEAD,
    add_campaign_arguments,
    campaign_config,
    check_outputs,
    prestart_workers,
)
from difftest.interfaces.commands._session_options import path_names, session_settings
from difftest.interfaces.console import ProgressLine
from difftest.model.case import Case
from difftest.records.atomic import write_json
from difftest.triage.groups import Triage

HELP = "measure cases per second per path and the time split (compile apart)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_campaign_arguments(p)
    p.add_argument("--no-warmup", action="store_true", help="do not compile ahead")
    p.add_argument(
        "--warmup-processes",
        type=int,
        default=0,
        help="compile ahead in this many spawned processes (default: one thread per path)",
    )


def main(args: argparse.Namespace) -> int:
    check_outputs(args)  # before the session starts a worker
    settings = session_settings(
        args, paths=path_names(args.paths), prestart=prestart_workers(args), skip_unfitting=True
    )
    with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as session:
        # warmup builds the cases bench runs: building them again behind it would only load
        # the CPU under the measurement, unless asked for
        ahead = args.compile_ahead if args.compile_ahead is not None else 0
        if args.no_warmup and args.compile_ahead is None:
            ahead = GPU_COMPILE_AHEAD if session.device.type == "cuda" else 0
        config = campaign_config(args, session.device, determinism_every=0, compile_ahead=ahead)
        # the worker starts behind the warmup, as the modules build before the campaign's clock
        session.spawn_early(config.workers)
        compile_s = draw_ahead_s = 0.0
        # the known bugs' triggers avoided as a campaign avoids them from its first case (the
        # cases are drawn here, ahead, for the warmup: the campaign gets them as a fixed list)
        known = known_triggers(config.known, session.runnable)
        planner = Planner(config, session.device, paths=session.runnable, triggers=lambda: known)
        source = iter(planner)
        if not args.no_warmup:
            # The cases warmed up for are the campaign's first ones: drawn once, run after.
            print("bench: drawing cases and compiling ahead ...", file=sys.stderr, flush=True)
            clock = time.perf_counter()
            head = list(itertools.islice(source, args.max_cases or 256))
            draw_ahead_s = time.perf_counter() - clock
            planned = [c for _, c in head]
            if args.warmup_processes > 0:
                # builds side by side also take the variants the known bugs' findings are
                # rechecked on (a reset trigger can need another module), as a campaign's
                # compile-ahead does; one thread per path builds only the cases' own
                active = {p.name for p in session.runnable}
                triage = Triage(config.known)
                resets = [r for c in planned for r in triage.resets_of(c, active)]
                built = warm_up_in_processes(
                    [*planned, *_one_per_variant(resets)],
                    session.runnable,
                    session.device,
                    args.warmup_processes,
                    args.plugin,
                )
            else:
                built = warm_up(planned, session.runnable, session.device)
            compile_s = sum(r.seconds for r in built)
            source = itertools.chain(head, source)
        progress = ProgressLine()
        report = run_campaign(config, session, cases=source, progress=progress, plan=planner.stats)
        progress.finish()
    wall = max(report.wall_s, 1e-9)
    kernels = report.timings.get("kernels", 0.0)
    compiled = report.timings.get("compile", 0.0)
    print(
        f"{report.cases} cases, {report.variants} variants, {wall:.1f}s "
        f"({report.cases / wall:.1f} cases/s); {report.launches} launches; "
        f"warmup builds {compile_s:.1f}s (cases drawn ahead for it in {draw_ahead_s:.1f}s)"
    )
    share = kernel_share(kernels, wall, compiled)
    print(
        "kernel time / (wall - compile): "
        + (f"{share:.3f}" if share is not None else "n/a (compile time is the whole wall time)")
        + f" (kernels {kernels:.2f}s, compile {compiled:.2f}s)"
    )
    shared = shared_device_note(config.workers, session.device.type)
    if shared is not None:
        print(shared)
    print(f"{'path':<24}{'cases':>7}{'seconds':>10}{'cases/s':>10}")
    for name, stats in report.paths.items():
        if stats.run:
            rate = stats.run / max(stats.seconds, 1e-9)
            print(f"{name:<24}{stats.run:>7}{stats.seconds:>10.2f}{rate:>10.1f}")
    split = {k: round(v, 3) for k, v in report.timings.items()}
    other = wall - sum(split.values())
    # the parent's phases (draw, record, triage) run while a launch runs in a worker, so the
    # phases can add up to more than the wall time
    rest = (
        f", framework/other {other:.1f}s ({other / wall:.0%})"
        if other >= 0
        else f"; phases overlap by {-other:.1f}s (the parent works while a worker runs)"
    )
    print(
        "time split: "
        + ", ".join(f"{k} {v:.1f}s ({v / wall:.0%})" for k, v in sorted(split.items()))
        + rest
    )
    if report.groups:
        new = len(report.new_groups)
        found = sum(g.count for g in report.groups)
        print(
            f"findings: {found} in {len(report.groups)} group(s), {new} new "
            f"(shrink and triage are in the time split; difftest run reports them)"
        )
    packed = report.packed_only_groups
    if packed:
        print(
            f"packed-only findings: {sum(g.count for g in packed)} in {len(packed)} group(s) "
            "(wrong in their packed launch, right alone; difftest run lists them)"
        )
    for name, reason in report.unavailable.items():
        print(f"not available here: {name}: {reason}", file=sys.stderr)
    for issue in report.health:
        print(issue.line(), file=sys.stderr)
    if args.json is not None:
        data = report.to_json()
        data["warmup_build_s"] = round(compile_s, 3)
        data["draw_ahead_s"] = round(draw_ahead_s, 3)
        data["cases_per_s"] = report.cases / wall
        data["kernel_share"] = share
        data["kernel_time_shared"] = shared is not None
        write_json(args.json, data)
    return int(report.exit_code())


def kernel_share(kernels: float, wall: float, compiled: float) -> float | None:
    """The headline, kernel time / (wall - compile); ``None`` where no wall time was left
    beside compiling. Several workers each count their own compile waits, so their sum can
    reach the wall time (a 4-worker bench on a bare H100 summed 28.8 s of compile in 28.6 s,
    and the quotient by the old floor of 1e-9 s printed 368205000.000, Run 30)."""
    rest = wall - compiled
    return kernels / rest if rest > 0 else None


def _one_per_variant(cases: list[Case]) -> list[Case]:
    """The first of ``cases`` of each compile variant (what a module build needs)."""
    seen: dict[tuple[object, ...], Case] = {}
    for case in cases:
        seen.setdefault(case.compile_variant(), case)
    return list(seen.values())


def shared_device_note(workers: int, device_type: str) -> str | None:
    """What the headline means when ``workers`` isolated workers share one GPU (``None`` when
    they do not: one worker, or a CPU, where each worker has a core of its own)."""
    if workers <= 1 or device_type == "cpu":
        return None
    return (
        f"note: {workers} workers share the device: a path's time is its host clock around a "
        "device sync, which also counts the other workers' queued work, so the kernel time "
        "above can count the same device time more than once; price the cases at a "
        "--workers 1 bench's kernel time a case for a figure that cannot"
    )
