"""Where a packed launch makes the host wait for the GPU, counted by the CUDA runtime itself.

    python benchmarks/count_gpu_waits.py [--limits gpu] [--pack 8] [--launches 6] [--seed 1]
                                         [--paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2]
                                         [--top 25]

``benchmarks/count_ops.py`` counts on any machine the operations that would wait; this script
asks the device. It evaluates a campaign's first ``--launches`` packed launches (after one
more to warm up: first uses compile and check; all of one compile variant, so that none
builds in the count) in this process with
``torch.cuda.set_sync_debug_mode("warn")``, under which torch warns at every operation that
synchronises the host with the device, and prints the waits per case, by the innermost
difftest function that caused them (file and line). Needs a CUDA GPU (exit 2 without one, in
one line); paths the device cannot run are left out by their own support check. No
assertion: for reading.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import traceback
import warnings
from pathlib import Path

import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import evaluate, packing
from difftest.generation.strategies import LIMITS
from difftest.paths import resolve

PACKAGE = str(Path(__file__).resolve().parents[1] / "difftest")


def _site() -> str:
    """The innermost difftest frame of the current stack, as ``file:line function``."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(PACKAGE):
            where = frame.filename[len(PACKAGE) + 1 :]
            return f"{where}:{frame.lineno} {frame.name}"
    return "(outside difftest)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="gpu", choices=sorted(LIMITS))
    parser.add_argument("--pack", type=int, default=8)
    parser.add_argument("--launches", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--paths", default="fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("count_gpu_waits: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    config = CampaignConfig(
        seed=args.seed, pack=args.pack, cases_per_variant=64, limits=LIMITS[args.limits]
    )
    planned = (case for _, case in planned_cases(config, "cuda"))
    paths = resolve(args.paths.split(","))

    def modules(group: list) -> set:  # type: ignore[type-arg]
        return {(p.name, p.module_key(c)) for p in paths for c in group}

    launches: list = []  # type: ignore[type-arg]
    for group in itertools.islice(packing.group_for_launches(planned, args.pack), 2000):
        # one compile variant's launches: the first builds its modules, the rest build none
        if len(group) > 1 and (not launches or modules(group) <= modules(launches[0])):
            launches.append(group)
        if len(launches) == args.launches + 1:
            break
    if len(launches) < 2:
        print(
            "count_gpu_waits: the plan gave no two launches of one compile variant", file=sys.stderr
        )
        return 2
    evaluate.evaluate_pack(launches[0], paths, device)  # first use: builds, checks, compiles
    torch.cuda.synchronize()
    sites: collections.Counter[str] = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        sites[_site()] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            for launch in launches[1:]:
                evaluate.evaluate_pack(launch, paths, device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cases = sum(len(launch) for launch in launches[1:])
    total = sum(sites.values())
    print(
        f"{cases} cases in {len(launches) - 1} launches (--limits {args.limits}, packs of up "
        f"to {args.pack}, paths {args.paths}): {total / cases:.2f} waits a case, "
        f"{total / (len(launches) - 1):.1f} a launch"
    )
    for site, count in sites.most_common(args.top):
        print(f"  {count / cases:7.2f}  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
