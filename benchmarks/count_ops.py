"""How many tensor operations a packed launch issues per case, part by part.

    python benchmarks/count_ops.py [--limits gpu] [--pack 8] [--launches 4] [--seed 1]
                                   [--paths torch-sdpa,torch-paged-online] [--gpu-route]

On a GPU a campaign's host time goes largely to issuing operations (each a dispatch and, on
the device, a launch of 5-20 us), and to the operations that make the host wait for the device
(:mod:`difftest.execution.op_census`), so their counts per case are figures a CPU can give. The
launches are a campaign's first packed ones of ``--pack`` cases at ``--limits`` (seed
``--seed``), evaluated on the CPU with ``--paths``; a dispatch mode counts each aten operation
(views and detaches left out) under the part of :func:`evaluate_pack` that issued it:
generation, packing, the oracle and its bounds, each path, the launch's judgement
(``agreeing``), one case's own judgement (``judge``, for the cases that do not agree), pairs
and the rest. ``--gpu-route`` counts as a CUDA device with Triton would run generation: the
fused store's kernel stands in as one operation per launch (its work done by the torch form,
not counted; a packed launch's stores run together, ``materialize.stores_together``), and
the case's integer plan reaches the device by one copy of one buffer
(:mod:`difftest.machine.host_copy`), so generation's count is the GPU's. The oracle's
count stays the torch form's (the GPU's fused oracle issues fewer). No assertion: for reading.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import bounds, evaluate, packing
from difftest.execution.op_census import Census
from difftest.generation import fused_store
from difftest.generation import materialize as materialize_module
from difftest.generation.strategies import LIMITS
from difftest.judgement import tolerance
from difftest.machine import host_copy
from difftest.paths import resolve

PARTS = (
    (evaluate, "_supported", "support"),
    (evaluate, "_materialize", "generate"),
    (evaluate, "_packed", "pack"),
    (bounds, "oracle_and_bounds", "oracle and bounds"),
    (evaluate, "run_path", "paths"),
    (tolerance, "agreeing", "agreeing"),
    (tolerance, "judge", "judge"),
    (bounds, "settle", "settle"),
    (bounds, "pair_up_launch", "pairs"),
)


@contextmanager
def _labelled(counter: Census) -> Iterator[None]:
    """Each part of :data:`PARTS` counts what it issues under its own name while it runs."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in PARTS]

    def label(fn: Callable[..., Any], part: str | None) -> Callable[..., Any]:
        def labelled(*args: Any, **kwargs: Any) -> Any:
            before, counter.part = counter.part, part
            try:
                return fn(*args, **kwargs)
            finally:
                counter.part = before

        return labelled

    try:
        for module, name, part in PARTS:
            setattr(module, name, label(getattr(module, name), part))
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


@contextmanager
def _gpu_route(counter: Census) -> Iterator[None]:
    """Generation as on a CUDA device with Triton: each launch of the fused store is one
    operation."""
    saved = (fused_store.usable, fused_store.launch, fused_store._checked)

    def kernel(segments: Any) -> None:
        counter.counts[counter.part or "other"] += 1
        before, counter.part = counter.part, None  # the stand-in's own work: not counted
        try:
            fused_store.one_by_one(materialize_module._store_torch, segments)
        finally:
            counter.part = before

    fused_store.usable = lambda device: True  # type: ignore[assignment]
    fused_store.launch = kernel  # type: ignore[assignment]
    fused_store._checked = True
    host_copy.ONE_COPY_ON_CPU = True
    try:
        yield
    finally:
        fused_store.usable, fused_store.launch, fused_store._checked = saved  # type: ignore[assignment]
        host_copy.ONE_COPY_ON_CPU = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", default="gpu", choices=sorted(LIMITS))
    parser.add_argument("--pack", type=int, default=8)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--paths", default="torch-sdpa,torch-paged-online")
    parser.add_argument(
        "--max-elements",
        type=float,
        default=3e7,
        help="skip launches whose pools hold more K/V elements (CPU time)",
    )
    parser.add_argument("--gpu-route", action="store_true")
    args = parser.parse_args()

    config = CampaignConfig(
        seed=args.seed, pack=args.pack, cases_per_variant=64, limits=LIMITS[args.limits]
    )
    launches = []
    for group in packing.group_for_launches(
        (case for _, case in planned_cases(config, "cpu")), args.pack
    ):
        if len(group) == args.pack and sum(c.pool_elements() for c in group) < args.max_elements:
            launches.append(group)
        if len(launches) == args.launches + 1:
            break
    paths = resolve(args.paths.split(","))
    counter = Census()
    with _labelled(counter):
        route: AbstractContextManager[None] = (
            _gpu_route(counter) if args.gpu_route else nullcontext()
        )
        with route:
            evaluate.evaluate_pack(launches[0], paths)  # first use: checks, caches
            counter.clear()
            with counter:
                for launch in launches[1:]:
                    evaluate.evaluate_pack(launch, paths)
    cases = sum(len(launch) for launch in launches[1:])
    total, waits = sum(counter.counts.values()), sum(counter.waits.values())
    views = sum(counter.views.values())
    kind = "GPU route (a fused-store launch as one operation)" if args.gpu_route else "CPU route"
    print(
        f"{cases} cases in {len(launches) - 1} launches of {args.pack}, --limits "
        f"{args.limits}, {kind}: {total / cases:.1f} operations a case and {views / cases:.1f} "
        f"views; {waits / cases:.2f} would wait for a GPU"
    )
    print(f"  {'part':18s} {'operations':>10s} {'views':>8s} {'waits':>8s}")
    for part in sorted({*counter.counts, *counter.views}, key=lambda p: -counter.counts[p]):
        figures = (counter.counts[part], counter.views[part], counter.waits[part])
        print(
            f"  {part:18s} {figures[0] / cases:10.1f} {figures[1] / cases:8.1f} "
            f"{figures[2] / cases:8.2f}"
        )
    if counter.waiting_ops:
        print("  the waits, a case:")
        for op, count in counter.waiting_ops.most_common():
            print(f"    {count / cases:6.2f}  {op}")


if __name__ == "__main__":
    main()
