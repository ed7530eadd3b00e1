"""What a case's plan costs on the host: :func:`difftest.generation.placement.place`.

    python benchmarks/bench_placement.py [--limits gpu] [--cases 300] [--seed 22] [--repeat 3]

The cases are a campaign's first ``--cases`` (seed ``--seed``, ``--limits``). Each round
plans every case once with the page-table cache emptied first (a campaign meets each case
once), and prints the milliseconds a case for the plan and for its page table alone, with
the stored tokens and runs a case. At the default GPU limits a case stores about 900,000
tokens: planned token by token the plan took about 60 ms a case on the 2-core machine (Run
32); as runs, about 2-3.5. With ``PYTHONPATH`` at an older checkout's root it times that
checkout's plan (before the runs: one element a stored token). No assertion: for reading.
"""

from __future__ import annotations

import argparse
import itertools
import time

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.generation import placement
from difftest.generation.strategies import LIMITS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="gpu", choices=sorted(LIMITS))
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = CampaignConfig(
        seed=args.seed, pack=8, cases_per_variant=64, limits=LIMITS[args.limits]
    )
    cases = [c for _, c in itertools.islice(planned_cases(config, "cpu"), args.cases)]
    n = len(cases)
    kept = getattr(placement, "_page_table", None)  # the page-table cache, where there is one

    def forget() -> None:
        if kept is not None:
            kept.cache_clear()

    for round_ in range(args.repeat):
        forget()
        clock = time.perf_counter()
        for case in cases:
            placement.page_table(case)
        tables = time.perf_counter() - clock
        forget()
        clock = time.perf_counter()
        plans = [placement.place(c) for c in cases]
        whole = time.perf_counter() - clock
        if hasattr(plans[0], "run_len"):
            tokens = sum(int(p.run_len.sum()) for p in plans) / n
            runs = sum(p.run_len.size for p in plans) / n
            stored = f"{tokens:,.0f} stored tokens in {runs:,.0f} runs"
        else:  # a checkout from before the runs (PYTHONPATH=its root): one element a token
            stored = f"{sum(p.token.size for p in plans) / n:,.0f} stored tokens, one by one"
        print(
            f"round {round_ + 1}: {n} cases (--limits {args.limits}, seed {args.seed}): "
            f"place {1e3 * whole / n:.2f} ms a case, of which the page table "
            f"{1e3 * tables / n:.2f}; {stored} a case"
        )


if __name__ == "__main__":
    main()
