"""Where a launch's memory goes, beyond its pool, on a CUDA device (prints its figures).

Runs one large launch, in each K/V storage layout, through the chosen paths in this process
(:func:`difftest.execution.evaluate.evaluate_pack`, as a worker does) with the CUDA
allocator's history recorded, and prints the peak against the pool's bytes and the largest
allocations alive at the peak, each with its innermost frames in difftest or FlashInfer: what a
planner that fits launches to a worker's memory share has to count.

    python benchmarks/launch_memory.py [--paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2]
        [--requests 600] [--prefix 9000] [--cases 1] [--plain-pool] [--top 12]
        [--launch PACKED.repro.json]

The made-up launch: ``--requests`` requests of ``--prefix`` tokens and more (bf16, one KV head,
head dim 64, page 16), split into ``--cases`` packed cases, its pool as the campaign draws many
(pages shuffled, stale values) unless ``--plain-pool``. ``--launch``: a packed-only finding's
file (its whole launch), read as any repro file is (a malformed one, or one that cannot fit,
is exit 2). Needs a CUDA device (and FlashInfer for its paths): exit 3 without one.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def _frames(block: dict, keep: int = 4) -> str:
    hits = []
    for f in block.get("frames", ()):
        name = f.get("filename", "")
        if "difftest/" in name or "flashinfer/" in name:
            short = (
                name.split("difftest/", 1)[-1]
                if "difftest/" in name
                else name.split("site-packages/", 1)[-1]
            )
            hits.append(f"{short}:{f.get('line')}({f.get('name')})")
        if len(hits) >= keep:
            break
    return " < ".join(hits) or "(no difftest/flashinfer frame)"


CAMPAIGN_POOL = {
    "page_order": "shuffled",
    "spare_pages": 4,
    "table_fill": "stale_pages",
    "stale_fill": "randn",
}
"""The made-up case's pool as the campaign draws many: pages shuffled, stale values past them."""


def _made_up(args: argparse.Namespace, storage: str) -> list:
    """The made-up launch in layout ``storage``: ``args.requests`` requests split into
    ``args.cases`` packable cases (one context length and table width for all of them)."""
    from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec

    prefixes = tuple(args.prefix + 7 * i for i in range(args.requests))
    whole = Case(
        attention=AttentionConfig(num_qo_heads=1, num_kv_heads=1, head_dim=64, page_size=16),
        batch=BatchSpec(mode="target_verify", prefix_lens=prefixes, q_len=2),
        pool=PoolSpec(
            kv_storage=storage,
            table_width="context",
            context_len=args.prefix + 7 * args.requests + 2,
            **({} if args.plain_pool else CAMPAIGN_POOL),
        ),
        seed=1,
    )
    per = -(-args.requests // args.cases)
    return [
        whole.replace(
            batch=dataclasses.replace(whole.batch, prefix_lens=prefixes[i : i + per]), seed=i
        )
        for i in range(0, args.requests, per)
    ]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--prefix", type=int, default=9000)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--cases", type=int, default=1, help="the requests split into this many packed cases"
    )
    parser.add_argument(
        "--plain-pool", action="store_true", help="pages in order, zeros past them, no spare"
    )
    parser.add_argument(
        "--launch",
        help="a packed repro file: its launch's cases, in each layout, instead of made-up ones",
    )
    args = parser.parse_args(argv)

    import torch

    from difftest.execution.evaluate import evaluate_pack
    from difftest.execution.packing import pool_bytes
    from difftest.model.case import BatchSpec
    from difftest.model.errors import DifftestError, FormatError
    from difftest.paths import registry
    from difftest.records.repro import load_repro
    from difftest.records.untrusted import check_fits

    dev = torch.device("cuda")
    given = None
    if args.launch:  # untrusted input: read as any repro file is, and refused if it cannot fit
        try:
            repro = load_repro(args.launch)
            if not repro.launch:
                raise FormatError(args.launch, "not a packed repro file (it has no launch)")
            if torch.cuda.is_available():
                check_fits(repro.case, dev, args.launch, launch=repro.launch)
        except DifftestError as e:
            sys.stderr.write(f"launch_memory: {e}\n")
            return 2
        given = list(repro.launch)
    if not torch.cuda.is_available():
        sys.stderr.write("launch_memory: no CUDA device\n")
        return 3
    paths = registry.resolve(args.paths.split(","))
    G = 2**30
    for storage in ("hnd", "nhd", "kv_split_nhd"):
        if given is not None:
            cases = [c.replace(pool=dataclasses.replace(c.pool, kv_storage=storage)) for c in given]
            evaluate_pack(cases[:1], paths, dev)  # compile and warm each path first
        else:
            cases = _made_up(args, storage)
            small = BatchSpec(mode="target_verify", prefix_lens=(40,), q_len=2)
            for p in paths:  # compile and warm each path first, on a small case
                evaluate_pack([cases[0].replace(batch=small)], [p], dev)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.memory._record_memory_history(max_entries=200000)
        results = evaluate_pack(cases, paths, dev)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated(dev)
        pool = pool_bytes(cases)
        verdicts = {r["path"]: r["outcome"] for r in results[0].to_json()["results"]}
        _say(
            f"\n== {storage}, {len(cases)} case(s): pool {pool / G:.3f} GiB, "
            f"held before {base / G:.3f}, "
            f"peak {peak / G:.3f} (beyond held and pool {(peak - base - pool) / G:.3f}) {verdicts}"
        )
        # replay the trace: the live blocks at the peak
        live: dict[int, dict] = {}
        best, best_live = 0, {}
        now = 0
        for trace in snap.get("device_traces", []):
            for e in trace:
                if e["action"] == "alloc":
                    live[e["addr"]] = e
                    now += e["size"]
                    if now > best:
                        best, best_live = now, dict(live)
                elif e["action"] == "free_completed" and e["addr"] in live:
                    now -= live.pop(e["addr"])["size"]
        _say(f"   traced allocations at their peak: {best / G:.3f} GiB beyond the held")
        for e in sorted(best_live.values(), key=lambda e: -e["size"])[: args.top]:
            _say(f"   {e['size'] / G:7.3f} GiB  {_frames(e)}")
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
