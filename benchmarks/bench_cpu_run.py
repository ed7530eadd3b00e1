"""Cases per second of a default ``difftest run`` on this machine, end to end, by wall clock.

    python benchmarks/bench_cpu_run.py [--budget-s 30] [--rounds 1] [-- EXTRA RUN OPTIONS]

Runs ``python -m difftest run --device cpu --budget-s B`` (every other option at its default:
the CPU paths, isolated workers, the default limits, seed 0) in a fresh output folder, as a
user would, ``--rounds`` times, and prints per round the cases, the wall-clock cases per
second the report gives (cases / the campaign's wall time, the worker start-up included), the
CPU time the command used (itself and its workers), the load average before it started, and
the report's phases: seconds and shares. Phase seconds are summed over the launches, so with
several workers running at once they add up to more than the wall time. Options after ``--``
are passed to ``difftest run`` (``-- --workers 1`` times one launch at a time).

The issue 16 target (2 cores, default ``difftest run``: 200 cases/s) is read off this figure.
No assertion on speed: CI runs it and prints. To time another checkout, run from that
checkout's folder: ``cd /path/to/other && PYTHONPATH=/path/to/other python
benchmarks/bench_cpu_run.py`` (``python -m difftest`` puts the current folder first on the
path, so run from this checkout's folder it times this checkout whatever ``PYTHONPATH`` says).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_round(budget_s: float, extra: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-cpu-run-") as tmp:
        out, report_file = Path(tmp) / "out", Path(tmp) / "report.json"
        command = [sys.executable, "-m", "difftest", "run", "--device", "cpu"]
        command += ["--budget-s", str(budget_s), "--out", str(out), "--json", str(report_file)]
        command += extra
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        clock = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        command_s = time.monotonic() - clock
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode not in (0, 1) or not report_file.is_file():
            raise SystemExit(f"difftest run failed ({done.returncode}):\n{done.stderr}")
        report = json.loads(report_file.read_text())
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cases, wall = report["cases"], report["wall_s"]
    timings: dict[str, float] = report["timings"]
    summed = sum(timings.values()) or 1.0
    phases = ", ".join(
        f"{k} {v:.1f}s ({v / summed:.0%})"
        for k, v in sorted(timings.items(), key=lambda kv: -kv[1])
    )
    return (
        f"{cases} cases in {wall:.1f}s: {cases / wall:.1f} cases/s "
        f"(command {command_s:.1f}s wall, {cpu_s:.1f}s CPU; load average before {load:.2f}; "
        f"stop: {report['stop_reason']})\n  phases (summed over launches): {phases}"
    )


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budget-s", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    print(
        f"difftest run --device cpu --budget-s {args.budget_s:g} {' '.join(extra)}".rstrip()
        + f" ({os.cpu_count()} CPUs)"
    )
    for n in range(args.rounds):
        print(f"round {n + 1}: {one_round(args.budget_s, extra)}", flush=True)


if __name__ == "__main__":
    main()
