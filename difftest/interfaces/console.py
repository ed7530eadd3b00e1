"""User-facing text: the live progress line and the summary tables. The one place that prints."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from difftest.campaign.run import CampaignReport


class ProgressLine:
    """A one-line live status on a terminal; a line every few seconds elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr, every_s: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.every_s = every_s
        self._last = 0.0

    def __call__(self, report: CampaignReport, elapsed: float) -> None:
        now = time.monotonic()
        if not self.tty and now - self._last < self.every_s:
            return
        self._last = now
        text = (
            f"[{elapsed:6.1f}s] cases {report.cases:5d} | findings {len(report.findings):3d} | "
            f"{report.cases / max(elapsed, 1e-9):6.1f} cases/s"
        )
        if self.tty:
            self.stream.write("\r" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def print_summary(report: CampaignReport, out: TextIO = sys.stdout) -> None:
    wall = max(report.wall_s, 1e-9)
    out.write(
        f"\n{report.cases} cases in {report.wall_s:.1f}s, {report.cases / wall:.1f} cases/s "
        f"(seed {report.config.seed}, case digest {report.case_digest})\n"
        f"{report.launches} launches ({report.packed_cases} cases packed), "
        f"{len(report.variants)} compile variants; modes: "
        + (", ".join(f"{m} {n}" for m, n in sorted(report.modes.items())) or "-")
        + "\n\n"
    )
    rows = [["path", "run", "agree", "findings", "skipped", "s/case"]]
    for name, stats in report.paths.items():
        found = sum(n for kind, n in stats.outcomes.items() if kind != "AGREE")
        per_case = f"{stats.seconds / stats.run:.4f}" if stats.run else "-"
        rows.append(
            [
                name,
                str(stats.run),
                str(stats.outcomes.get("AGREE", 0)),
                str(found),
                str(stats.skipped),
                per_case,
            ]
        )
    _table(rows, out)
    if report.unavailable:
        out.write("\nnot available here:\n")
        for name, reason in report.unavailable.items():
            out.write(f"  {name}: {reason}\n")
    partial = {
        name: stats.skip_reasons
        for name, stats in report.paths.items()
        if stats.skip_reasons and name not in report.unavailable
    }
    if partial:
        out.write("\nskipped cases (path: count, reason):\n")
        for name, reasons in partial.items():
            for reason, count in reasons.most_common(3):
                out.write(f"  {name}: {count}x {reason}\n")
    if report.timings:
        split = ", ".join(f"{k} {v:.1f}s" for k, v in report.timings.items())
        other = report.wall_s - sum(report.timings.values())
        out.write(f"\ntime: {split}, other {max(other, 0.0):.1f}s\n")
    if report.interrupted:
        out.write(
            "\ninterrupted: this covers the cases finished before; the launch being run is "
            f"kept as pending repros in {report.config.out_dir / 'running'}\n"
        )
    if report.findings:
        out.write(f"\n{len(report.findings)} finding(s):\n")
        for f in report.findings:
            out.write(f"  {f['kind']:<16} {f['path']}: {f['reason']}\n    repro: {f['repro']}\n")
    else:
        out.write("\nno findings\n")
