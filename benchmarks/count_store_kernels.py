"""How many fused-store kernels a campaign's first launches make Triton compile.

    python benchmarks/count_store_kernels.py [--limits gpu] [--pack 8] [--launches 60]
                                             [--seed 22] [--max-elements 2e7]

Triton compiles one kernel per distinct set of a kernel's constexprs, its pointers' dtypes,
and the "specialisations" of the arguments it specialises: an integer equal to 1, divisible
by 16 or neither; a pointer 16-byte aligned or not. Each is a compile of about a second on
the GPU machine's host, in every process that meets it first (Triton's disk cache serves a
later process). This script materialises a campaign's first ``--launches`` packed launches on
the CPU with generation's GPU route (each fused-store launch recorded, then done by the torch
form), takes each launch's kernel arguments from
:func:`difftest.generation.fused_store.launch_arguments` and applies those rules, minus the
arguments the kernel is told not to specialise (``fused_store.NOT_SPECIALISED``,
``ARRAY_ARGS``), and prints how many store calls, launches (a packed launch's stores run
together, :func:`materialize.stores_together`) and distinct kernels there were. It models
Triton's rules, it does not ask Triton: for reading, no assertion. Launches whose pools hold
more than ``--max-elements`` K/V elements are passed over (CPU time).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import torch

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.generation import fused_store
from difftest.generation import materialize as materialize_module
from difftest.generation.strategies import LIMITS
from difftest.machine import host_copy


def specialisation(name: str, value: Any) -> object:
    """What Triton tells kernels apart by, for one argument."""
    if isinstance(value, torch.Tensor):
        aligned = name in fused_store.ARRAY_ARGS or value.data_ptr() % 16 == 0
        return (str(value.dtype), aligned)
    if name in fused_store.NOT_SPECIALISED:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and name.islower():
        return "1" if value == 1 else "D" if value % 16 == 0 else "-"
    return value  # a constexpr (upper-case names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="gpu", choices=sorted(LIMITS))
    parser.add_argument("--pack", type=int, default=8)
    parser.add_argument("--launches", type=int, default=60)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--max-elements", type=float, default=2e7)
    args = parser.parse_args()

    kernels: Counter[tuple[object, ...]] = Counter()

    def record(segments: Any) -> None:
        launch = fused_store.launch_arguments(segments)
        if launch is not None:
            _, named = launch
            kernels[tuple(specialisation(k, v) for k, v in sorted(named.items()))] += 1
            stores[0] += len(segments)
        fused_store.one_by_one(materialize_module._store_torch, segments)

    stores = [0]
    fused_store.usable = lambda device: True  # type: ignore[assignment]
    fused_store.launch = record  # type: ignore[assignment]
    fused_store._checked = True
    host_copy.ONE_COPY_ON_CPU = True
    config = CampaignConfig(
        seed=args.seed, pack=args.pack, cases_per_variant=4, limits=LIMITS[args.limits]
    )
    cpu, launches = torch.device("cpu"), 0
    planned = (case for _, case in planned_cases(config, "cpu"))
    for group in packing.group_for_launches(planned, args.pack):
        if sum(c.pool_elements() for c in group) > args.max_elements:
            continue
        _, parts = packing.launch_pool(group, cpu)
        _, rows = packing.launch_queries(group, cpu)
        with materialize_module.stores_together():
            for case, part, q in zip(group, parts, rows, strict=True):
                materialize_module.materialize(case, cpu, pool=part, queries=q)
        launches += 1
        if launches == args.launches:
            break
    print(
        f"--limits {args.limits}, --pack {args.pack}, seed {args.seed}: {launches} launches, "
        f"{stores[0]} fused-store calls in {sum(kernels.values())} launches, {len(kernels)} "
        "distinct kernels to compile"
    )


if __name__ == "__main__":
    main()
