"""What isolation costs: the same cases through the campaign loop, ``--isolation process``
against ``--isolation none``.

    python benchmarks/bench_isolation.py [--count 200] [--rounds 3] [--pack 1]

The cases are the stored ones of ``tests/data/verdicts.json`` (the same whatever the
checkout), run by :func:`difftest.campaign.loop.run_campaign` on the CPU paths
(``torch-sdpa``, ``torch-paged-online``) with shrinking off, one torch thread, the two modes
alternating for ``--rounds`` rounds (a shared machine's load changes by the minute; alternating
spreads it over both). The isolated worker is started before the clock starts (its start-up is
printed apart: a real run pays it once). Printed per mode: the median wall time, the median
CPU time (this process and its workers), and the time split; then the ratios process/none.
``isolation`` in the split is the wall time of a case that the worker's own timings do not
cover (messages, decoding, waking up).

No assertion on speed: CI may run it and print.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig
from difftest.execution.interrupts import Interrupts
from difftest.execution.session import Session, Settings
from difftest.model.case import Case

CPU_PATHS = ("torch-sdpa", "torch-paged-online")
STORED = Path(__file__).parents[1] / "tests" / "data" / "verdicts.json"


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def one_run(cases: list[Case], isolation: str, pack: int, out: Path) -> dict[str, object]:
    settings = Settings(device="cpu", paths=CPU_PATHS, isolation=isolation)  # type: ignore[arg-type]
    config = CampaignConfig(shrink=False, pack=pack, out_dir=out, max_cases=len(cases))
    cpu = _cpu_s()
    with Session(settings, interrupts=Interrupts()) as session:
        executor = session.executor()
        clock = time.perf_counter()
        if hasattr(executor, "start"):
            executor.start()
        startup = time.perf_counter() - clock
        clock = time.perf_counter()
        report = run_campaign(config, session, cases=iter(enumerate(cases)))
        wall = time.perf_counter() - clock
    return {
        "wall": wall,
        "cpu": _cpu_s() - cpu,
        "startup": startup,
        "cases": report.cases,
        "timings": report.timings,
        "outcomes": {n: dict(p.outcomes) for n, p in report.paths.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--pack",
        type=int,
        default=1,
        help="cases per launch (the stored cases "
        "are single cases; packing groups those that share launch arguments)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    entries = json.loads(STORED.read_text())["cases"][: args.count]
    cases = [Case.from_json(e["case"]) for e in entries]
    runs: dict[str, list[dict[str, object]]] = {"none": [], "process": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in ("none", "process") if r % 2 == 0 else ("process", "none"):
                runs[mode].append(one_run(cases, mode, args.pack, Path(tmp) / f"{mode}{r}"))
    print(f"{len(cases)} stored cases, paths {CPU_PATHS}, pack {args.pack}, {args.rounds} rounds")
    medians = {}
    for mode, got in runs.items():
        walls = [float(g["wall"]) for g in got]  # type: ignore[arg-type]
        cpus = [float(g["cpu"]) for g in got]  # type: ignore[arg-type]
        medians[mode] = (statistics.median(walls), statistics.median(cpus))
        split: dict[str, float] = {}
        for g in got:
            for k, v in g["timings"].items():  # type: ignore[attr-defined]
                split[k] = split.get(k, 0.0) + v / len(got)
        print(
            f"{mode:>8}: wall median {medians[mode][0]:.2f}s (all {', '.join(f'{w:.2f}' for w in walls)}), "
            f"CPU median {medians[mode][1]:.2f}s, {len(cases) / medians[mode][0]:.1f} cases/s"
            + (
                f"; worker start-up {statistics.median(float(g['startup']) for g in got):.2f}s"  # type: ignore[arg-type]
                if mode == "process"
                else ""
            )
        )
        print("          split: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(split.items())))
    same = all(g["outcomes"] == runs["none"][0]["outcomes"] for m in runs.values() for g in m)
    print(
        f"process / none: wall {medians['process'][0] / medians['none'][0]:.3f}x, "
        f"CPU {medians['process'][1] / medians['none'][1]:.3f}x; "
        f"outcome counts {'identical' if same else 'DIFFER'} across runs"
    )


if __name__ == "__main__":
    main()
