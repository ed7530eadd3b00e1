"""The device time of the fused store and the fused oracle, by tile and block shape, on a GPU.

    python benchmarks/sweep_device_kernels.py [--launches 6] [--pack 8] [--seed 22] [--reps 3]
        [--paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2] [--only store|oracle]
        [--profile-once] [--default-only] [--passes 1|2] [--spread]
        [--capped [--max-keys 32] [--regs N]]

At the default GPU limits a case's device time is mostly difftest's own: the fused store's
kernel (generation) and the oracle's kernels each cost many times the
kernels under test (docs/validation.md, Run 35). Their shapes were chosen without a sweep. This
times, on the first ``--launches`` packed launches a campaign plans (``--pack`` cases each,
default GPU limits, the planner of ``--paths``), each shape of

- the store: :data:`fused_store.BLOCK` (elements a program writes) x :data:`fused_store.WARPS`,
  the launch's cases materialised as :func:`evaluate._materialize` does; a tile's shape does
  not change a bit (each element is a function of its coordinates), which this checks by
  comparing the pool's bytes with the default shape's;
- the oracle: two passes or one (:data:`fused.ONE_PASS`) x :data:`fused.KEYS_PER_ITEM` x the
  keys of a float64 step x warps (the float64 output alone, as a launch without floors
  computes it); these change the order of the sums, so the output is compared with the
  default's as a share of its largest magnitude;

with CUDA events around each call, the median of ``--reps`` after one untimed call (its
compiles). For scale it also times writing and reading the launch's pool at memory speed
(``fill_``, ``sum``). No assertion: it prints.

``--default-only`` times the default shapes alone (to compare two versions of the code);
``--passes`` sweeps the oracle's shapes in that form alone (the one pass also by its
pipeline's depth). ``--spread`` takes the first full launch of each oracle shape (head dim,
cache dtype, group) instead of the plan's first launches, which are of one variant (at seed
22: head dim 64, one KV head, ``L`` = 2, thousands of keys a request: 2 real rows of the
oracle's 16).
``--capped`` replaces the oracle's block sizes by :func:`capped` before anything runs (so
with ``--default-only`` it times that rule against a run without it): at most ``--max-keys``
keys a float64 step, at most ``--regs`` registers a thread. With ``--default-only`` each
launch's time is printed too, with its shape.
``--profile-once`` sweeps nothing: after one untimed pass (compiles, first-use checks) it
stores each launch's cases and runs the oracle once more at the default shapes, inside an NVTX
range named ``profiled``, for a kernel profiler to select (Nsight Compute: ``ncu --nvtx
--nvtx-include "profiled/" python benchmarks/sweep_device_kernels.py --profile-once``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import difftest
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution import packing
from difftest.generation import fused_store, placement
from difftest.generation.materialize import materialize, stores_together
from difftest.judgement.tolerance import oracle_outputs
from difftest.model.case import Case
from difftest.oracle import fused
from difftest.paths import resolve


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median device milliseconds of ``fn`` over ``reps`` calls, after one untimed call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


class Launch:
    """A packed launch's cases, their pool and query rows, materialised on the device."""

    def __init__(self, cases: list[Case], dev: torch.device) -> None:
        self.cases = cases
        self.dev = dev
        self.storage, self.split = packing.launch_pool(cases, dev)
        self.queries, self.q_split = packing.launch_queries(cases, dev)
        self.plans = list(placement.on_device([placement.place(c) for c in cases], dev))
        self.batches = self.materialize()
        self.packed = packing.pack(self.batches, self.storage, self.queries)

    def materialize(self) -> list:
        with stores_together():
            return [
                materialize(c, self.dev, pool=p, queries=q, plan=pl)
                for c, p, q, pl in zip(
                    self.cases, self.split, self.q_split, self.plans, strict=True
                )
            ]

    def elements(self) -> int:
        return self.storage.numel() + self.queries.numel()

    def label(self) -> str:
        """The launch's oracle shape: head dim, cache dtype, query heads a KV head, keys."""
        a = self.cases[0].attention
        keys = sum(c.total_kv_tokens() for c in self.cases)
        return f"D{a.head_dim} {a.kv_dtype} {a.num_qo_heads // a.num_kv_heads}:1 {keys} keys"


def sweep_store(launches: list[Launch], reps: int, default_only: bool = False) -> None:
    shapes = [
        (1024, 4),
        (8192, 4),
        (8192, 2),
        (16384, 4),
        (16384, 8),
        (4096, 2),
        (2048, 2),
        (1024, 8),
    ]
    default = (fused_store.BLOCK, getattr(fused_store, "WARPS", 4))
    if default_only:
        shapes = [default]
    elements = sum(launch.elements() for launch in launches)
    nbytes = sum(launch.storage.numel() * launch.storage.element_size() for launch in launches)
    fill = sum(timed(lambda lc=lc: lc.storage.fill_(0), reps) for lc in launches)
    read = sum(timed(lambda lc=lc: lc.storage.float().sum(), reps) for lc in launches)
    print(
        f"store: {len(launches)} launches, {elements / 1e6:.1f} M elements ({nbytes / 1e9:.2f} GB "
        f"of pool); fill_ {fill:.3f} ms, widen+sum {read:.3f} ms"
    )
    expected = []
    for launch in launches:
        launch.materialize()
        expected.append(launch.storage.clone())
    print(f"{'BLOCK':>6} {'warps':>5} {'ms':>9} {'ns/elem':>8} {'x fill_':>8}  same bytes")
    for block, warps in shapes:
        fused_store.BLOCK, fused_store.WARPS = block, warps
        total = 0.0
        same = True
        for launch, want in zip(launches, expected, strict=True):
            launch.storage.fill_(0)
            total += timed(launch.materialize, reps)
            same = same and torch.equal(launch.storage.view(torch.uint8), want.view(torch.uint8))
        mark = " (default)" if (block, warps) == default else ""
        print(
            f"{block:>6} {warps:>5} {total:>9.3f} {total * 1e6 / elements:>8.4f} "
            f"{total / fill:>8.1f}  {same}{mark}",
            flush=True,
        )
    fused_store.BLOCK, fused_store.WARPS = default


def sweep_oracle(
    launches: list[Launch], reps: int, default_only: bool = False, passes: int | None = None
) -> None:
    original = fused.block_sizes
    keys_default = fused.KEYS_PER_ITEM

    def shaped(
        n_scale: float, warps: int | None, stages: int | None
    ) -> Callable[[int], fused.Blocks]:
        def sizes(d: int) -> fused.Blocks:
            b = original(d)
            # (a checkout before the pipeline's depth was a field has no such field)
            depth = {} if stages is None else {"stages": stages}
            return dataclasses.replace(
                b, n=max(16, int(b.n * n_scale)), warps=warps or b.warps, **depth
            )

        return sizes

    def run(launch: Launch) -> torch.Tensor:
        ref, _ = oracle_outputs(launch.packed.batch, (), fused.batched_attention)
        return ref

    references = [run(launch) for launch in launches]
    scales = [float(r.abs().max()) or 1.0 for r in references]
    one_default = fused.ONE_PASS
    print(
        f"{'passes':>6} {'keys/item':>9} {'n scale':>7} {'warps':>5} {'stages':>6} {'ms':>9}  "
        "largest difference / |ref|"
    )
    default_shape = (one_default, keys_default, 1.0, None, None)
    forms = (False, True) if passes is None else (passes == 1,)
    shapes = itertools.product(forms, (512, 2048), (0.5, 1.0, 2.0), (None, 8), (None,))
    if passes == 1:  # the one pass's shapes, with the pipeline's depth (each is a compile)
        shapes = iter(
            [(True, 2048, n, w, st) for n in (1.0, 0.5) for w, st in ((None, None), (None, 2))]
            + [(True, 2048, 1.0, None, 1), (True, 2048, 1.0, 8, None), (True, 2048, 2.0, 8, 2)]
        )
    if default_only:
        shapes = iter([default_shape])
    for one_pass, keys, n_scale, warps, stages in shapes:
        fused.ONE_PASS = one_pass
        fused.KEYS_PER_ITEM = keys
        fused.block_sizes = shaped(n_scale, warps, stages)
        total, worst = 0.0, 0.0
        each = []
        passes = 1 if one_pass else 2
        try:
            for launch, want, scale in zip(launches, references, scales, strict=True):
                each.append(timed(lambda lc=launch: run(lc), reps))
                total += each[-1]
                worst = max(worst, float((run(launch) - want).abs().max()) / scale)
        except Exception as exc:  # a shape Triton cannot build: say so, go on
            print(
                f"{passes:>6} {keys:>9} {n_scale:>7} {str(warps):>5} {str(stages):>6}  "
                f"failed: {str(exc)[:100]}",
                flush=True,
            )
            continue
        default = (one_pass, keys, n_scale, warps, stages) == default_shape
        mark = " (default)" if default else ""
        print(
            f"{passes:>6} {keys:>9} {n_scale:>7} {str(warps):>5} {str(stages):>6} {total:>9.3f}  "
            f"{worst:.3g}{mark}",
            flush=True,
        )
        if default_only:  # by launch, to see which shapes a change moves
            for launch, ms in zip(launches, each, strict=True):
                print(f"    {ms:9.3f} ms  {launch.label()}", flush=True)
    fused.KEYS_PER_ITEM, fused.block_sizes, fused.ONE_PASS = keys_default, original, one_default


def profile_once(launches: list[Launch], only: str | None) -> None:
    """Each launch stored and judged once at the default shapes, inside the NVTX range
    ``profiled`` (after an untimed pass outside it)."""

    def once() -> None:
        for launch in launches:
            if only in (None, "store"):
                launch.materialize()
            if only in (None, "oracle"):
                oracle_outputs(launch.packed.batch, (), fused.batched_attention)

    once()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profiled")
    once()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"profiled: {len(launches)} launches once ({only or 'store and oracle'})", flush=True)


def capped(
    original: Callable[[int], fused.Blocks], keys: int = 32, regs: int | None = None
) -> Callable[[int], fused.Blocks]:
    """The block sizes ``original`` gives with at most ``keys`` keys a float64 step; ``regs``:
    at most that many registers a thread (Triton's ``maxnreg``). At 32 keys and no cap this
    changes nothing in :func:`fused.block_sizes` since docs/validation.md Run 42, which took
    that rule from it (106.2 against 112.8 ms on 12 launches of every shape, an H100; at head
    dim 256 also the pipeline depth of 1); a cap of 128 registers (four programs of four warps
    a multiprocessor, where the one pass uses 222-255 registers: two) spilled 128-616 bytes a
    thread and took 125.4 ms."""

    def sizes(d: int) -> fused.Blocks:
        b = original(d)
        return dataclasses.replace(b, n=min(keys, b.n), regs=regs)

    return sizes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=6)
    p.add_argument("--pack", type=int, default=8)
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--paths", default="fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2")
    p.add_argument("--only", choices=("store", "oracle"))
    p.add_argument("--profile-once", action="store_true")
    p.add_argument("--default-only", action="store_true")
    p.add_argument("--passes", type=int, choices=(1, 2))
    p.add_argument("--spread", action="store_true")
    p.add_argument("--capped", action="store_true")
    p.add_argument("--max-keys", type=int, default=32, help="with --capped: keys a step")
    p.add_argument("--regs", type=int, help="with --capped: registers a thread at most")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("sweep_device_kernels: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    config = CampaignConfig(seed=args.seed, pack=args.pack, cases_per_variant=64)
    paths = resolve(args.paths.split(","))
    groups = packing.group_for_launches(
        (case for _, case in planned_cases(config, dev, paths=paths)), args.pack
    )
    if args.spread:  # the first full launch of each shape the oracle sees, in plan order
        seen: set[tuple[object, ...]] = set()
        chosen = []
        for g in itertools.islice(groups, 128 * args.launches):
            a = g[0].attention
            variant = (a.head_dim, a.kv_dtype, a.num_qo_heads // a.num_kv_heads)
            if len(g) == args.pack and variant not in seen:
                seen.add(variant)
                chosen.append(g)
            if len(chosen) == args.launches:
                break
    else:
        chosen = [g for g in itertools.islice(groups, 4 * args.launches) if len(g) == args.pack]
    launches = [Launch(g, dev) for g in chosen[: args.launches]]
    print(
        f"{len(launches)} launches of {args.pack} (seed {args.seed}), "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"difftest from {Path(difftest.__file__).parent}"
        + (
            f", block sizes capped (--capped: {args.max_keys} keys a step at most, "
            f"registers {args.regs or 'uncapped'})"
            if args.capped
            else ""
        ),
        flush=True,
    )
    if args.capped:
        fused.block_sizes = capped(fused.block_sizes, args.max_keys, args.regs)
    if args.profile_once:
        profile_once(launches, args.only)
        return 0
    if args.only in (None, "store"):
        sweep_store(launches, args.reps, args.default_only)
    if args.only in (None, "oracle"):
        sweep_oracle(launches, args.reps, args.default_only, args.passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
