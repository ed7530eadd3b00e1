"""Where a GPU campaign's *device* time goes: each phase's kernels, by CUDA time.

    python benchmarks/profile_gpu_time.py [--preset llama-3.1-8b] [--launches 12] [--warm 4]
        [--paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2] [-- DIFFTEST BENCH OPTIONS, e.g. --device cpu]

The launches are the first ones ``difftest bench`` plans for the same options (the planner,
the preset, the default GPU limits and packing). Their modules are built first and ``--warm``
launches run unprofiled (first-use costs); then ``--launches`` launches run in this process
(``evaluate_pack``, as ``--isolation none`` runs them) under :mod:`torch.profiler` with CUDA
activity. Printed: the wall time, the summed time of every kernel on the device (and so how
busy the device was), per phase (generate, oracle, each path, judge: the ``difftest.*`` ranges
:mod:`difftest.execution.evaluate` marks) its host time and its span on the device's timeline,
and the kernels that took the most device time. A GPU whose kernels fill most of the wall
time is the limit, not the host; which phase launched the costliest kernels says what to make
cheaper.

For a CUDA GPU (and FlashInfer for its paths); on a CPU (``--paths torch-sdpa -- --device
cpu``) it shows host times only. No assertion on speed: it prints.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict

import torch

from difftest.campaign.planning import Planner, known_triggers
from difftest.execution import packing
from difftest.execution.evaluate import evaluate_pack
from difftest.execution.session import Session
from difftest.execution.warmup import warm_up
from difftest.interfaces.cli import add_common
from difftest.interfaces.commands import bench
from difftest.interfaces.commands._campaign_options import campaign_config
from difftest.interfaces.commands._session_options import path_names, session_settings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-3.1-8b", help="a model preset, or none")
    p.add_argument("--paths", default="fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2")
    p.add_argument("--launches", type=int, default=12)
    p.add_argument("--warm", type=int, default=4)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("rest", nargs="*", help="more difftest bench options (after --)")
    args = p.parse_args()
    bp = argparse.ArgumentParser()
    add_common(bp)
    bench.add_arguments(bp)
    preset = [] if args.preset == "none" else ["--preset", args.preset]
    bargs = bp.parse_args([*preset, "--paths", args.paths, "--isolation", "none", *args.rest])
    settings = session_settings(bargs, paths=path_names(bargs.paths))
    with Session(settings) as session:
        dev = session.device
        if dev.type != "cuda":
            print("profile_gpu_time: no CUDA device: host times only", file=sys.stderr)

        def sync() -> None:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        config = campaign_config(bargs, dev, determinism_every=0, compile_ahead=0)
        known = known_triggers(config.known, session.runnable)
        planner = Planner(config, dev, paths=session.runnable, triggers=lambda: known)
        wanted = args.warm + args.launches
        launches = list(
            itertools.islice(
                packing.group_for_launches(
                    iter(planner), max(1, config.pack), case_of=lambda x: x[1]
                ),
                wanted,
            )
        )
        cases = [[c for _, c in group] for group in launches]
        built = warm_up([c for g in cases for c in g], session.runnable, dev)
        print(f"modules built or loaded in {sum(r.seconds for r in built):.1f}s")
        for group in cases[: args.warm]:
            evaluate_pack(group, session.runnable, dev)
        sync()
        measured = cases[args.warm :]
        acts = [torch.profiler.ProfilerActivity.CPU]
        if dev.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            clock = time.perf_counter()
            for group in measured:
                evaluate_pack(group, session.runnable, dev)
            sync()
            wall = time.perf_counter() - clock
    events = prof.key_averages()
    n_cases = sum(len(g) for g in measured)
    # the device's own events, less the ranges' annotations on its timeline (a range's span,
    # not work: counted, it would count its kernels twice)
    kernels = [
        e
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.key.startswith("difftest.")
    ]
    device_us = sum(e.self_device_time_total for e in kernels)
    print(
        f"{args.preset}: {len(measured)} launches, {n_cases} cases, wall {wall:.3f}s "
        f"({n_cases / wall:.1f} cases/s, profiled); device busy {device_us / 1e6:.3f}s "
        f"= {device_us / 1e6 / wall:.0%} of the wall"
    )
    # per phase: its host time, and its span on the device's timeline (the annotation the
    # profiler puts there: from the phase's first kernel to its last, idle gaps included; an
    # upper bound on its kernels' time, and near it for a phase that keeps the device busy)
    host: dict[str, float] = defaultdict(float)
    span: dict[str, float] = defaultdict(float)
    for e in events:
        if not e.key.startswith("difftest."):
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA:
            span[e.key] += e.self_device_time_total
        else:
            host[e.key] += e.cpu_time_total
    print(f"{'phase':<34}{'host s':>10}{'device span s':>15}")
    for key, us in sorted(host.items(), key=lambda kv: -kv[1]):
        print(f"{key:<34}{us / 1e6:>10.3f}{span.get(key, 0.0) / 1e6:>15.3f}")
    _by_phase(prof.events(), n_cases)
    print(f"top {args.top} kernels by device time:")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[: args.top]:
        share = e.self_device_time_total / max(device_us, 1)
        print(f"{e.self_device_time_total / 1e6:>8.3f}s {share:>5.0%} {e.count:>7}x  {e.key[:110]}")
    return 0


def _by_phase(events: list, n_cases: int) -> None:
    """Per phase (its ``difftest.*`` ranges, outermost first; a range inside another is counted
    in both): the ranges' host time, the device time of the kernels launched inside them (not
    their span: idle gaps excluded), the tensor operations they called, each per case, and the
    phase's costliest kernels. A phase whose device time is near its host time keeps the device
    busy; one with many operations and little device time is launch-bound."""
    rows: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    kernels: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def walk(e, phase: str) -> None:
        for k in e.kernels:
            kernels[phase][k.name] += k.duration
        for child in e.cpu_children:
            if child.name.startswith("difftest."):
                continue  # counted as its own phase (and inside this one by device time)
            rows[phase][3] += 1
            walk(child, phase)

    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or not e.name.startswith("difftest."):
            continue
        row = rows[e.name]
        row[0] += 1
        row[1] += e.cpu_time_total
        row[2] += e.device_time_total
        walk(e, e.name)
    print(f"{'phase (per case)':<30}{'ranges':>8}{'host ms':>10}{'device ms':>11}{'ops':>8}")
    for name, (count, host_us, dev_us, ops) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(
            f"{name:<30}{count / n_cases:>8.2f}{host_us / 1e3 / n_cases:>10.3f}"
            f"{dev_us / 1e3 / n_cases:>11.3f}{ops / n_cases:>8.1f}"
        )
    for name, ks in kernels.items():
        top = sorted(ks.items(), key=lambda kv: -kv[1])[:6]
        if top:
            print(
                f"  {name}: " + "; ".join(f"{us / 1e3 / n_cases:.3f} ms {k[:60]}" for k, us in top)
            )


if __name__ == "__main__":
    raise SystemExit(main())
