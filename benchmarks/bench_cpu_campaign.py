"""Cases per second of a default CPU campaign's case work, by CPU time, phase by phase.

    python benchmarks/bench_cpu_campaign.py [--count 150] [--seed 0] [--threads 1] [--stored]

The cases are the first ``count`` a default ``difftest run`` on a CPU plans (seed ``seed``,
default limits, every CPU path: ``torch-sdpa`` and ``torch-paged-online``). Each is drawn,
then evaluated in this process as the campaign's ``--isolation none`` loop does (materialise,
oracle and noise floors, every path, judgement). ``--stored``: the cases of
``tests/data/verdicts.json`` instead (the same cases whatever the checkout: Hypothesis mixes
constants from the source of the modules it finds loaded into what it draws, so two checkouts
plan different cases from one seed; drawing time is then not measured).
Figures printed: cases per second of this process's CPU time (on a shared machine other processes then count less than in wall time),
per phase the seconds and share (the evaluation's own timings, wall clock), and the median and
p90 milliseconds per case. ``--threads`` is torch's thread count (the CPU target is 2 cores:
``--threads 2`` then counts both cores' time, so CPU-time cases/s is per core).

No assertion on speed: CI runs it and prints. To time another checkout with the same script
(before/after a change): ``PYTHONPATH=/path/to/other/checkout python benchmarks/...``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

from difftest.campaign.planning import CampaignConfig, Planner
from difftest.execution.evaluate import evaluate
from difftest.model.case import Case
from difftest.paths.registry import get_path

CPU_PATHS = ("torch-sdpa", "torch-paged-online")
STORED = Path(__file__).parents[1] / "tests" / "data" / "verdicts.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stored", action="store_true", help="the stored cases of verdicts.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    paths = [get_path(n) for n in CPU_PATHS]
    clock = time.process_time()
    if args.stored:
        entries = json.loads(STORED.read_text())["cases"][: args.count]
        planned = [Case.from_json(e["case"]) for e in entries]
    else:
        plan = Planner(CampaignConfig(seed=args.seed), cpu)
        planned = [c for _, c in itertools.islice(plan, args.count)]
    draw_s = 0.0 if args.stored else time.process_time() - clock
    phases: dict[str, float] = {"draw": draw_s}
    per_case: list[float] = []
    clock = time.process_time()
    for case in planned:
        start = time.process_time()
        result = evaluate(case, paths, cpu)
        per_case.append(time.process_time() - start)
        for phase, seconds in result.timings.items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    run_s = time.process_time() - clock
    total = draw_s + run_s
    n = len(planned)
    print(f"{n} cases (seed {args.seed}, {args.threads} torch thread(s), paths {CPU_PATHS})")
    print(
        f"CPU time: {total:.2f}s, {n / total:.1f} cases/s (draw {draw_s:.2f}s = "
        f"{1000 * draw_s / n:.2f} ms/case; evaluate {run_s:.2f}s, {n / run_s:.1f} cases/s)"
    )
    per_case.sort()
    print(
        f"evaluate per case: median {1000 * statistics.median(per_case):.1f} ms, "
        f"p90 {1000 * per_case[int(0.9 * (n - 1))]:.1f} ms, max {1000 * per_case[-1]:.1f} ms"
    )
    summed = sum(phases.values())
    print(
        "phases: "
        + ", ".join(
            f"{k} {v:.2f}s ({v / summed:.0%})"
            for k, v in sorted(phases.items(), key=lambda kv: -kv[1])
        )
    )


if __name__ == "__main__":
    main()
