"""How busy a GPU was, and with whose kernels, from an Nsight Systems trace of a campaign.

    nsys profile --trace=cuda --sample=none -o run difftest run --workers 8 ...
    nsys export --type sqlite -o run.sqlite run.nsys-rep
    python benchmarks/device_timeline.py run.sqlite [--top 25] [--skip-s 5]

:mod:`profile_gpu_time` sees one process's kernels; with several workers sharing a device
(under CUDA's Multi-Process Service their kernels can run side by side) the question is the
device's: for what share of the wall time did any kernel run, how many ran at once, and whose
were they. Printed, over the trace's span after its first ``--skip-s`` seconds (start-up and
first-use compiles): the span, the time at least one kernel ran (the union of the kernels'
intervals) and its share of the span, the kernels' summed time (over the union: how many ran
at once, on average), and each kind of kernel's summed time, count and mean (oracle: the
float64 oracle's Triton kernels; store: the generator's; flashinfer: the paths' kernels;
torch: the rest), then the ``--top`` kernels by summed time, then each process's share.

Reads the ``CUPTI_ACTIVITY_KIND_KERNEL`` table (and ``StringIds`` for names) with the standard
library's sqlite3. No assertion on speed: it prints.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("oracle", re.compile(r"^(maxima|sums|online|combine)\b")),
    ("store", re.compile(r"^(store|token_normals|_store|fill_segments)", re.I)),
    ("flashinfer", re.compile(r"xqa|flashinfer|Batch|Prefill|Decode|fmha|kernel_mha", re.I)),
)
"""A kernel's kind by its name, first match wins; anything else is ``torch``."""


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "torch"


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of half-open ``[start, end)`` intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def rows(db: sqlite3.Connection) -> list[tuple[int, int, int, str]]:
    """``(start, end, pid, name)`` of every kernel, in nanoseconds."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    name_col = "shortName" if "shortName" in columns else "demangledName"
    query = (
        f"SELECT k.start, k.end, k.globalPid, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        f"JOIN StringIds s ON s.id = k.{name_col}"
    )
    # a global process id holds the process's id in its bits 24-47
    return [(a, b, (g >> 24) & 0xFFFFFF, n) for a, b, g, n in db.execute(query)]


def report(kernels: Sequence[tuple[int, int, int, str]], skip_s: float, top: int) -> list[str]:
    if not kernels:
        return ["no kernels in the trace"]
    first = min(k[0] for k in kernels) + int(skip_s * 1e9)
    kept = [k for k in kernels if k[0] >= first]
    if not kept:
        return [f"no kernel starts after the first {skip_s} s"]
    span = max(k[1] for k in kept) - first
    busy = union_length((a, b) for a, b, _, _ in kept)
    summed = sum(b - a for a, b, _, _ in kept)
    out = [
        f"span {span / 1e9:.3f} s after the first {skip_s} s; {len(kept)} kernels",
        f"some kernel running {busy / 1e9:.3f} s ({busy / span:.1%} of the span); kernels' "
        f"summed time {summed / 1e9:.3f} s ({summed / max(busy, 1):.2f} at once, on average)",
        "",
        f"{'kind':<12}{'summed s':>10}{'share':>8}{'count':>10}{'mean us':>10}",
    ]
    by_kind: dict[str, list[int]] = defaultdict(list)
    by_name: dict[str, list[int]] = defaultdict(list)
    by_pid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for a, b, pid, name in kept:
        by_kind[kind_of(name)].append(b - a)
        by_name[name].append(b - a)
        by_pid[pid].append((a, b))
    for kind, ds in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        out.append(
            f"{kind:<12}{sum(ds) / 1e9:>10.3f}{sum(ds) / summed:>8.1%}{len(ds):>10}"
            f"{sum(ds) / len(ds) / 1e3:>10.1f}"
        )
    out += ["", f"top {top} kernels by summed time:"]
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    for name, ds in ranked:
        out.append(
            f"  {sum(ds) / 1e9:8.3f} s {len(ds):>8} x {sum(ds) / len(ds) / 1e3:9.1f} us  "
            f"[{kind_of(name)}] {name[:90]}"
        )
    out += ["", "processes (kernels' union on the device, share of the span):"]
    for pid, spans in sorted(by_pid.items(), key=lambda kv: -len(kv[1])):
        own = union_length(spans)
        out.append(f"  pid {pid}: {len(spans)} kernels, {own / 1e9:.3f} s ({own / span:.1%})")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sqlite", help="an `nsys export --type sqlite` of the trace")
    parser.add_argument("--skip-s", type=float, default=0.0, help="seconds left out at the start")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        db = sqlite3.connect(f"file:{args.sqlite}?mode=ro", uri=True)
        kernels = rows(db)
    except sqlite3.Error as e:
        print(
            f"device_timeline: {args.sqlite}: not an Nsight Systems export ({e})", file=sys.stderr
        )
        return 2
    print("\n".join(report(kernels, args.skip_s, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
