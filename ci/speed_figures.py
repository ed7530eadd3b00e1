"""The figures of ``ci/h200_speed.sh``, summarised from its reports into ``speed.json``.

    python ci/speed_figures.py REPORTS_DIR OUT_DIR

(FlashInfer's test's JUnit XML is read from REPORTS_DIR/fitest.xml.)

Per bench: cases, cases/s, the headline kernel time / (wall - compile), each phase's share of
the wall time and each path's cases/s. FlashInfer's test: its cold first case and warm median.
Small shape against it: our cases/s over its warm cases/s. Isolation: the wall-time ratio of
the process-isolated run over the in-process one: of the two commands' wall times (from
``run-*.wall``: start-up included, as a user waits for it), of the reports' campaign wall
times, and of those less the time either spent on compiles; only of two runs of the same
cases (the same count and case digest).
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def bench_figures(report: dict[str, Any]) -> dict[str, Any]:
    wall = report.get("wall_s") or 0.0
    timings = report.get("timings", {})
    paths = {}
    for name, stats in report.get("paths", {}).items():
        run, seconds = stats.get("run", 0), stats.get("seconds", 0.0)
        if run:
            paths[name] = {"run": run, "cases_per_s_of_its_time": run / max(seconds, 1e-9)}
    return {
        "cases": report.get("cases"),
        "variants": report.get("variants"),
        "launches": report.get("launches"),
        "wall_s": wall,
        "cases_per_s": report.get("cases_per_s"),
        "kernel_share": report.get("kernel_share"),
        "warmup_build_s": report.get("warmup_build_s"),
        "phase_share": {k: round(v / wall, 4) for k, v in timings.items()} if wall else {},
        "phase_s": timings,
        "paths": paths,
        "groups": [
            (g.get("path"), g.get("kind"), g.get("count"), g.get("known"))
            for g in report.get("groups", [])
        ],
    }


def fitest_figures(xml: Path) -> dict[str, Any] | None:
    times = [
        float(t.get("time", 0))
        for t in ET.parse(xml).iter("testcase")
        if not list(t.iter("skipped"))
    ]
    if not times:
        return None
    warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {
        "cases": len(times),
        "first_s": times[0],
        "warm_median_s": warm,
        "warm_cases_per_s": 1 / warm if warm else None,
    }


def isolation_figures(
    runs: dict[str, dict[str, Any]], commands: dict[str, float | None]
) -> dict[str, Any]:
    wall = {k: r.get("wall_s") or 0.0 for k, r in runs.items()}
    cases = {k: r.get("cases") for k, r in runs.items()}
    compiled = {
        k: sum(r.get("timings", {}).get(t, 0.0) for t in ("compile", "compile_wait"))
        for k, r in runs.items()
    }
    digests = {k: r.get("case_digest") for k, r in runs.items()}
    # a ratio only of two runs of the same cases (the report's digest of every case run)
    same = bool(cases["none"]) and cases["process"] == cases["none"]
    same = same and digests["process"] == digests["none"]
    less = {k: wall[k] - compiled[k] for k in runs}
    command = commands if all(commands.values()) else None
    return {
        "command_wall_s": command,
        "command_ratio": command["process"] / command["none"] if same and command else None,
        "wall_s": wall,
        "cases": cases,
        "same_cases": same,
        "compile_s": compiled,
        "ratio": wall["process"] / wall["none"] if same and wall["none"] else None,
        "ratio_less_compile": less["process"] / less["none"] if same and less["none"] else None,
    }


def medians(pairs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median of each ratio over the isolation rounds that have it."""
    found: dict[str, float | None] = {}
    for key in ("command_ratio", "ratio", "ratio_less_compile"):
        values = [p[key] for p in pairs if p[key] is not None]
        found[f"median_{key}"] = statistics.median(values) if values else None
    return found


def main(reports: Path, out: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for file in sorted(reports.glob("bench-*.json")):
        figures[file.stem] = bench_figures(json.loads(file.read_text()))
    xml = reports / "fitest.xml"
    fitest = fitest_figures(xml) if xml.exists() else None
    if fitest is not None:
        figures["fitest"] = fitest
        for name, bench in list(figures.items()):
            if name.startswith("bench-small") and bench["cases_per_s"]:
                figures[f"{name}_vs_fitest_warm"] = bench["cases_per_s"] * fitest["warm_median_s"]
    rounds = sorted(int(f.stem.rpartition("-")[2]) for f in reports.glob("run-process-*.json"))
    pairs = []
    for r in rounds:
        runs = {k: reports / f"run-{k}-{r}.json" for k in ("process", "none")}
        if not all(f.exists() for f in runs.values()):
            continue  # the round was cut short
        walls = {k: reports / f"run-{k}-{r}.wall" for k in runs}
        pairs.append(
            isolation_figures(
                {k: json.loads(f.read_text()) for k, f in runs.items()},
                {k: float(f.read_text()) if f.exists() else None for k, f in walls.items()},
            )
        )
    if pairs:
        figures["isolation"] = {"rounds": pairs, **medians(pairs)}
    (out / "speed.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python ci/speed_figures.py REPORTS_DIR OUT_DIR")
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2])), indent=1))
