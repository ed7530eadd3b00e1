"""How fast a case is materialised, against how fast the same tensors can merely be written.

    python benchmarks/bench_generation.py [--device cuda] [--count 200] [--seed 16] [--repeat 5]
                                          [--threads 1] [--numpy auto]

Cases: ``count`` drawn from ``strategies.cases(limits=CPU_LIMITS)`` with a fixed seed, plus a
few large ones (a long-context llama rank, a big fp8 pool with stale data). For each case the
best of ``repeat`` timings of :func:`materialize` is kept, and the same for two baselines that
write tensors of the same sizes and dtypes on the same device: ``torch.empty(...).fill_`` (pure
memory writes) and ``torch.randn`` (torch's own generator). Figures printed: median and p90 ms
per case, and ns per generated element (elements of ``q_padded`` and ``kv_storage``, summed
over the cases, over the summed time), with its ratio to ``fill_``; the large cases also each
get a line (their fill_ and materialize times). On a CPU the time is this
process's CPU time, on one torch thread by default as the tests run (on a shared machine other
processes then count less); with more threads, and on a GPU, wall-clock time. No assertion
on speed: this is for reading.

To time another checkout's generator (today's, say) with this script, put it first on the
path: ``PYTHONPATH=/path/to/other/checkout python benchmarks/bench_generation.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, cases
from difftest.model.batch import DTYPES
from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec, ValueSpec


def large_cases() -> list[Case]:
    llama = AttentionConfig(num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16)
    gptoss = AttentionConfig(
        num_qo_heads=16,
        num_kv_heads=2,
        head_dim=64,
        page_size=32,
        kv_dtype="fp8_e4m3",
        k_scale=0.25,
        v_scale=0.5,
        sinks=True,
        window_left=127,
    )
    qwen = AttentionConfig(num_qo_heads=16, num_kv_heads=1, head_dim=256, page_size=64)
    return [
        Case(
            attention=llama,
            batch=BatchSpec(mode="target_verify", prefix_lens=(8000,) * 4, q_len=4),
            pool=PoolSpec(page_order="shuffled", kv_storage="hnd"),
            seed=1,
        ),
        Case(
            attention=gptoss,
            batch=BatchSpec(mode="draft_extend_v2", prefix_lens=(3000, 500, 7000, 1), q_len=8),
            pool=PoolSpec(
                kv_storage="kv_split_nhd", stale_fill="large", spare_pages=64, shared_prefix_pages=0
            ),
            values=ValueSpec(family="outlier_tokens"),
            seed=2,
        ),
        Case(
            attention=qwen,
            batch=BatchSpec(mode="target_verify", prefix_lens=(4096, 4096), q_len=3),
            pool=PoolSpec(
                kv_storage="nhd",
                page_order="reversed",
                shared_prefix_pages=32,
                stale_fill="randn",
                table_width="context",
                context_len=32768,
                table_fill="stale_pages",
            ),
            values=ValueSpec(family="near_ties", scale=0.5),
            seed=3,
        ),
    ]


def shapes(case: Case) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The (shape, dtype) of each generated tensor of ``case`` (q_padded, kv_storage)."""
    a, b = case.attention, case.batch
    rows = b.num_query_rows + b.padding_rows
    slots = case.num_pages() * a.page_size
    return [
        ((rows, a.num_qo_heads, a.head_dim), DTYPES[a.q_dtype]),
        ((2, slots, a.num_kv_heads, a.head_dim), DTYPES[a.kv_dtype]),
    ]


def fill(dev: torch.device, case: Case) -> None:
    for shape, dtype in shapes(case):
        torch.empty(shape, dtype=dtype, device=dev).fill_(1.0)


def randn(dev: torch.device, case: Case) -> None:
    for shape, dtype in shapes(case):
        # torch.randn has no fp8 kernel: draw in bf16 (the same bytes per element... almost).
        draw = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
        torch.randn(shape, dtype=draw, device=dev)


def show(line: str) -> None:
    print(line)  # noqa: T201 (a script that prints its figures)


def timed(fn: Callable[[], object], dev: torch.device, repeat: int) -> float:
    """Best of ``repeat`` runs: CPU time of this process on one CPU thread (other processes on a
    shared machine then count less), else wall-clock time (between synchronisations on a GPU)."""
    one_thread = dev.type == "cpu" and torch.get_num_threads() == 1
    clock = time.process_time if one_thread else time.perf_counter
    best = float("inf")
    for _ in range(repeat):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = clock()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, clock() - t0)
    return best


def report(name: str, times: list[float], elements: int, mem_ns: float | None) -> float:
    ms = sorted(t * 1e3 for t in times)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    ns = sum(times) * 1e9 / elements
    ratio = f"  {ns / mem_ns:6.1f}x fill_" if mem_ns else ""
    show(
        f"  {name:<12} median {statistics.median(ms):8.3f} ms  p90 {p90:8.3f} ms  "
        f"max {ms[-1]:9.3f} ms  {ns:7.2f} ns/elem{ratio}"
    )
    return ns


PER_CASE = 5
"""Groups of at most this many cases also get a line per case."""


def bench(label: str, group: list[Case], dev: torch.device, repeat: int) -> None:
    elements = sum(torch.Size(s).numel() for c in group for s, _ in shapes(c))
    show(f"{label}: {len(group)} cases, {elements / 1e6:.1f} M elements")
    t_fill = [timed(lambda c=c: fill(dev, c), dev, repeat) for c in group]
    t_randn = [timed(lambda c=c: randn(dev, c), dev, repeat) for c in group]
    t_mat = [timed(lambda c=c: materialize(c, dev), dev, repeat) for c in group]
    mem = report("fill_", t_fill, elements, None)
    report("randn", t_randn, elements, mem)
    report("materialize", t_mat, elements, mem)
    if len(group) <= PER_CASE:  # a few large cases: each one's figures
        for case, f, m in zip(group, t_fill, t_mat, strict=True):
            n = sum(torch.Size(s).numel() for s, _ in shapes(case))
            a = case.attention
            show(
                f"    {n / 1e6:6.1f} M elements ({a.kv_dtype}, {a.num_kv_heads} KV heads x "
                f"{a.head_dim}, {case.pool.kv_storage}, stale {case.pool.stale_fill}): "
                f"fill_ {f * 1e3:7.3f} ms, materialize {m * 1e3:7.3f} ms"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)"
    )
    parser.add_argument(
        "--numpy",
        choices=("auto", "on", "off"),
        default="auto",
        help="hash CPU tensors in numpy (rng.NUMPY_ON_CPU; auto: when torch has one thread)",
    )
    args = parser.parse_args()
    if args.numpy != "auto":
        from difftest.generation import rng

        rng.NUMPY_ON_CPU = args.numpy == "on"  # (an older generator has no such switch: harmless)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    drawn = sample_cases(cases(limits=CPU_LIMITS), seed=args.seed, count=args.count)
    big = large_cases()
    show(f"device {dev}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for case in drawn[:3] + big[:1]:  # warm up allocators and kernels
        materialize(case, dev)
        fill(dev, case)
        randn(dev, case)
    bench("sampled", drawn, dev, args.repeat)
    bench("large", big, dev, args.repeat)


if __name__ == "__main__":
    main()
