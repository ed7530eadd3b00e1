"""User-facing text: the live progress line and the campaign report. The one place that prints.

The report leads with the groups (which bugs there are), NEW before KNOWN, each in four lines:
what it is and how often, what it needs (its trigger in words), its minimal case, and where
its repro is. Per-path statistics, health checks, avoidance and time come after; the list of
every finding is only in the JSON (and ``findings.jsonl``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from difftest.campaign.report import CampaignReport
from difftest.machine.memory import unfitted_count
from difftest.triage.groups import GroupRecord


class ProgressLine:
    """A one-line live status on a terminal; a line every few seconds elsewhere."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self._last = 0.0

    def __call__(self, cases: int, findings: int, groups: int, elapsed: float) -> None:
        if self._due():
            self._write(
                f"[{elapsed:6.1f}s] cases {cases:5d} | findings {findings:4d} in {groups:2d} "
                f"group(s) | {cases / max(elapsed, 1e-9):6.1f} cases/s"
            )

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def shrinking(self, start_size: int) -> Callable[[int, int, str], None]:
        """A shrink's progress (:data:`difftest.reduction.driver.ShrinkProgress`) on this
        line: runs spent, the smallest failing size against the original, the running pass."""
        began = time.monotonic()

        def show(runs: int, size: int, pass_name: str) -> None:
            if self._due():
                self._write(
                    f"[{time.monotonic() - began:6.1f}s] shrink runs {runs:4d} | size "
                    f"{start_size} -> {size} | pass {pass_name}",
                    width=78,
                )

        return show

    def _due(self) -> bool:
        """Whether to show a line now: always on a terminal, every ``every_s`` elsewhere."""
        now = time.monotonic()
        if not self.tty and now - self._last < self.every_s:
            return False
        self._last = now
        return True

    def _write(self, text: str, width: int = 0) -> None:
        """Over the previous line on a terminal (padded to ``width``), a new line elsewhere."""
        self.stream.write("\r" + text.ljust(width) if self.tty else text + "\n")
        self.stream.flush()


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def group_lines(g: GroupRecord) -> list[str]:
    """One group, as the report and the gate summary show it."""
    return g.lines()


def print_report(report: CampaignReport, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    wall = max(report.wall_s, 1e-9)
    new, known = report.new_groups, [g for g in report.groups if not g.is_new]
    packed = report.packed_only_groups
    packed_words = ""
    if packed:
        n = sum(g.count for g in packed)
        packed_words = f"; {n} of them packed-only, in {len(packed)} group(s)"
    out.write(
        f"\n{report.cases} cases in {report.wall_s:.1f}s ({report.cases / wall:.1f} cases/s; "
        f"seed {report.config.seed}, case digest {report.case_digest}): "
        f"{len(report.findings)} finding(s) in {len(report.groups)} group(s), "
        f"{len(new)} new, {len(known)} known{packed_words}\n"
    )
    if report.stop_reason:
        out.write(f"stopped: {report.stop_reason}\n")
    for g in [*new, *known]:
        out.write("\n" + "\n".join(group_lines(g)) + "\n")
    for pg in packed:
        out.write("\n" + "\n".join(pg.lines()) + "\n")
    if not report.groups and not packed:
        out.write("\nno findings\n")
    out.write(
        f"\n{report.launches} launches ({report.packed_cases} cases packed), "
        f"{report.variants} compile variants; modes: "
        + (", ".join(f"{m} {n}" for m, n in sorted(report.modes.items())) or "-")
        + "\n"
    )
    rows = [["path", "run", "agree", "findings", "skipped", "s/case"]]
    for name, stats in report.paths.items():
        per_case = f"{stats.seconds / stats.run:.4f}" if stats.run else "-"
        rows.append(
            [
                name,
                str(stats.run),
                str(stats.outcomes.get("AGREE", 0) + stats.outcomes.get("IGNORES", 0)),
                str(stats.findings),
                str(stats.skipped),
                per_case,
            ]
        )
    _table(rows, out)
    ignoring = {name: stats.ignored for name, stats in report.paths.items() if stats.ignored}
    if ignoring:
        out.write("\nignored arguments (set by the cases, no effect: exact attention):\n")
        for name, ignored in ignoring.items():
            args = ", ".join(f"{arg} in {n} case(s)" for arg, n in sorted(ignored.items()))
            out.write(f"  {name} IGNORES {args}\n")
    if report.unavailable:
        out.write("\nnot available here:\n")
        for name, reason in report.unavailable.items():
            out.write(f"  {name}: {reason}\n")
    for issue in report.health:
        out.write(f"\n{issue.line()}\n")
    plan = report.plan
    if plan.avoided:
        out.write("\navoided triggers (cases moved off each, and kept on it):\n")
        for trigger, n in plan.avoided.most_common():
            out.write(f"  {' & '.join(trigger)}: {n} avoided, {plan.kept.get(trigger, 0)} kept\n")
    if plan.unsupported_redrawn:
        out.write(
            f"\n{plan.unsupported_redrawn} template(s) no chosen kernel path supports were "
            "drawn again\n"
        )
    unfitted = max(
        (unfitted_count(stats.skip_reasons) for stats in report.paths.values()), default=0
    )
    if unfitted:
        out.write(
            f"\n{unfitted} case(s) not run for lack of memory (out of memory twice, alone): "
            "fewer workers on the device (--workers) or smaller --limits would run them\n"
        )
    if report.died:
        out.write(
            f"\n{len(report.died)} case(s) were running when the last run into this folder "
            f"died; kept as pending repros under {report.out_dir}/died/: "
            + ", ".join(report.died[:8])
            + (" ..." if len(report.died) > 8 else "")
            + "\n"
        )
    if report.timings:
        split = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(report.timings.items()))
        other = report.wall_s - sum(report.timings.values())
        # a worker runs the next launch while this process triages, records and draws:
        # the phases can add up to more than the wall time
        rest = f"other {other:.1f}s" if other >= 0 else f"phases overlap by {-other:.1f}s"
        out.write(f"\ntime: {split}, {rest}\n")
    if report.compile_ahead is not None:
        ahead = report.compile_ahead
        waited = report.timings.get("compile_wait", 0.0)
        out.write(
            f"compiled ahead: {ahead.builds} module(s) in {ahead.processes} process(es), "
            f"{ahead.work_s:.1f}s of build work; waited on compiles {waited:.1f}s "
            f"({waited / max(report.wall_s, 1e-9):.0%} of the wall time)"
            + (f"; {ahead.unfinished} build(s) stopped unfinished" if ahead.unfinished else "")
            + (f"; {ahead.cached} found built in the cache" if ahead.cached else "")
            + (
                f"; {ahead.filled} case(s) of built variants run while modules built"
                if ahead.filled
                else ""
            )
            + "\n"
        )
        for line in ahead.failed:
            out.write(f"  build failed (its cases ran without it): {line}\n")
        for name, count in ahead.judged_later.items():
            out.write(
                f"  {name}: judged {count} case(s) after the other paths had run them "
                "(its module was still building)\n"
            )
        for name, count in ahead.never_judged.items():
            out.write(
                f"  {name}: did not judge {count} case(s) the other paths ran "
                "(its module was still building when the campaign ended)\n"
            )
    if report.interrupted:
        out.write(
            "\ninterrupted: this covers the cases finished before; every finding is in "
            f"{report.out_dir}/findings.jsonl\n"
        )
