"""How busy a GPU was, and with whose kernels, from a trace of a campaign's processes.

    python benchmarks/device_timeline.py TRACE... [--top 25] [--skip-s 5]

A TRACE is an Nsight Systems export (``nsys profile --trace=cuda -o run difftest run ...``,
then ``nsys export --type sqlite -o run.sqlite run.nsys-rep``), or the workers' own windows
(``DIFFTEST_DEVICE_TRACE_DIR``: :mod:`difftest.execution.device_trace`, Chrome traces of
:mod:`torch.profiler` with absolute timestamps), given as files or as the folder that holds
them.

:mod:`profile_gpu_time` sees one process's kernels; with several workers sharing a device
(under CUDA's Multi-Process Service their kernels can run side by side) the question is the
device's: for what share of the wall time did any kernel run, how many ran at once, and whose
were they. Printed, over the trace's span after its first ``--skip-s`` seconds (start-up and
first-use compiles; for the workers' windows, the span most of them share, by the bounds
each wrote beside its trace, the workers outside it named): the span, the
time at least one kernel ran (the union of the kernels' intervals) and its share of the span,
the kernels' summed time (over the union: how many ran at once, on average), and each kind of
kernel's summed time, count and mean (oracle: the float64 oracle's Triton kernels; store: the
generator's; flashinfer: the paths' kernels; torch: the rest), then the ``--top`` kernels by
summed time, then each process's share.

No assertion on speed: it prints. A file that is neither is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from difftest.execution.device_trace import window_file

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("oracle", re.compile(r"^(maxima|sums|online|combine)(\b|_)")),
    ("store", re.compile(r"^(store_kernel|token_normals_kernel)")),
    ("flashinfer", re.compile(r"xqa|flashinfer|BatchPrefill|BatchDecode|fmha|kernel_mha", re.I)),
)
"""A kernel's kind by its name, first match wins; anything else is ``torch``. FlashInfer's own
kernels are named by their namespace or family (``flashinfer::BatchPrefillWithPagedKVCache
Kernel``, XQA's ``kernel_mha``); a bare ``Batch`` would also take cuBLAS's batched products
(``cublasGemvTensorStridedBatched``) and torch's ``CatArrayBatchedCopy``, which until Run 48
counted the float32 noise floors' products as the paths' kernels."""


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


class NotATrace(ValueError):
    """A file that is neither an Nsight Systems export nor a Chrome trace with kernels' times."""


def chrome_rows(file: Path, pid: int) -> list[tuple[int, int, int, str]]:
    """``(start, end, pid, name)`` in nanoseconds of the kernels of one process's Chrome trace
    (:mod:`torch.profiler`'s: ``cat`` "kernel", ``ts`` and ``dur`` in microseconds after
    ``baseTimeNanoseconds``). Its kernels are filed under ``pid`` (the trace puts them under
    the device's number)."""
    try:
        data = json.loads(file.read_text())
        base = int(data.get("baseTimeNanoseconds", 0))
        events = data["traceEvents"]
        out = []
        for e in events:
            if e.get("ph") == "X" and e.get("cat") == "kernel":
                start = base + round(float(e["ts"]) * 1000)
                out.append((start, start + round(float(e["dur"]) * 1000), pid, str(e["name"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise NotATrace(f"{file}: not a Chrome trace ({type(e).__name__})") from None
    return out


Kernel = tuple[int, int, int, str]
"""``(start_ns, end_ns, pid, name)``."""


class Windows(NamedTuple):
    """The span the workers' windows share most, and whose they are."""

    start: int
    end: int
    inside: tuple[int, ...]
    """The processes whose windows cover the span."""
    bounds: dict[int, tuple[int, int]]
    """Every process's window."""
    work: dict[int, str]
    """What each process did in its window, where its bounds say (launches, cases, wait)."""

    @property
    def outside(self) -> tuple[int, ...]:
        """The processes whose windows do not cover the span (their kernels there were not
        recorded)."""
        return tuple(sorted(p for p in self.bounds if p not in self.inside))


def window_bounds(trace: Path, own: Sequence[Kernel]) -> tuple[tuple[int, int] | None, str]:
    """A worker's window on the wall clock and what it did there: ``worker-<pid>.window.json``
    beside its trace (:mod:`difftest.execution.device_trace` writes it), else, for a trace
    without one, the extent of its kernels (shorter than the window where the worker waited
    for work) and nothing said."""
    side = Path(window_file(str(trace)))
    if side.exists():
        try:
            data = json.loads(side.read_text())
            opened, closed = int(data["open_ns"]), int(data["close_ns"])
            work = ""
            if "messages" in data:
                work = (
                    f"{int(data['messages'])} launches ({int(data['cases'])} cases) in its "
                    f"window of {(closed - opened) / 1e9:.2f} s, waiting for work "
                    f"{float(data['waited_s']):.2f} s of it"
                )
            return (opened, closed), work
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise NotATrace(f"{side}: not a window's bounds ({type(e).__name__})") from None
    if not own:
        return None, ""
    return (min(k[0] for k in own), max(k[1] for k in own)), ""


def most_shared(bounds: dict[int, tuple[int, int]], work: dict[int, str] | None = None) -> Windows:
    """The longest span covered by the most windows (a sweep over their ends): a worker that
    was replaced mid-run, or opened its window late, leaves the span to the others and is
    named among those outside it, instead of shrinking everyone's common span to nothing."""
    edges = sorted([(a, 1) for a, _ in bounds.values()] + [(b, -1) for _, b in bounds.values()])
    best = (0, 0, 0, 0)  # (covering, length, start, end)
    covering = 0
    for (at, step), (nxt, _) in zip(edges, edges[1:], strict=False):
        covering += step
        if nxt > at and (covering, nxt - at) > best[:2]:
            best = (covering, nxt - at, at, nxt)
    _, _, start, end = best
    inside = tuple(sorted(p for p, (a, b) in bounds.items() if a <= start and end <= b))
    return Windows(start, end, inside, dict(bounds), dict(work or {}))


def load(paths: Sequence[str]) -> tuple[list[Kernel], Windows | None]:
    """The kernels of every trace named (a folder: its ``*.trace.json``), and for several
    workers' windows the span most of them share (:func:`most_shared`), ``None`` for a
    whole-run trace (an Nsight Systems export)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.trace.json")) if p.is_dir() else [p]
    if not files:
        raise NotATrace(f"{', '.join(paths)}: no trace files")
    kernels: list[Kernel] = []
    bounds: dict[int, tuple[int, int]] = {}
    work: dict[int, str] = {}
    for i, f in enumerate(files):
        if f.suffix == ".json":
            number = f.name.removeprefix("worker-").split(".")[0]
            pid = int(number) if number.isdigit() else i
            own = chrome_rows(f, pid)
            window, did = window_bounds(f, own)
            if window is not None:
                bounds[pid] = window
            if did:
                work[pid] = did
        else:
            try:
                db = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
                own = rows(db)
            except sqlite3.Error as e:
                raise NotATrace(f"{f}: not an Nsight Systems export ({e})") from None
        kernels += own
    if not bounds:
        return kernels, None
    return kernels, most_shared(bounds, work)


def report(
    kernels: Sequence[Kernel], skip_s: float, top: int, windows: Windows | None = None
) -> list[str]:
    """The report's lines: over ``windows``' span when given (the kernels' time clipped to
    it), else from the first kernel to the last; ``skip_s`` seconds left out at its start."""
    out: list[str] = []
    if windows is not None:
        out.append(
            f"the span {len(windows.inside)} of {len(windows.bounds)} "
            f"workers' windows share: {(windows.end - windows.start) / 1e9:.3f} s"
        )
        if windows.outside:
            named = ", ".join(map(str, windows.outside))
            out.append(f"  windows outside it (their kernels there not recorded): pid {named}")
        origin = min(a for a, _ in windows.bounds.values())
        out.append(
            "  windows (s after the first opened): "
            + ", ".join(
                f"pid {pid} {(a - origin) / 1e9:.2f}-{(b - origin) / 1e9:.2f}"
                for pid, (a, b) in sorted(windows.bounds.items(), key=lambda kv: kv[1])
            )
        )
        first, last = windows.start + int(skip_s * 1e9), windows.end
        kept = [
            (max(a, first), min(b, last), pid, name)
            for a, b, pid, name in kernels
            if b > first and a < last and pid in windows.inside
        ]
        if last <= first:
            return [*out, f"the span is shorter than the first {skip_s} s"]
    else:
        if not kernels:
            return ["no kernels in the trace"]
        first = min(k[0] for k in kernels) + int(skip_s * 1e9)
        kept = [k for k in kernels if k[0] >= first]
        if not kept:
            return [f"no kernel starts after the first {skip_s} s"]
        last = max(k[1] for k in kept)
    span = last - first
    busy = union_length((a, b) for a, b, _, _ in kept)
    summed = sum(b - a for a, b, _, _ in kept)
    out += [
        f"span {span / 1e9:.3f} s after the first {skip_s} s; {len(kept)} kernels",
        f"some kernel running {busy / 1e9:.3f} s ({busy / span:.1%} of the span); kernels' "
        f"summed time {summed / 1e9:.3f} s ({summed / max(busy, 1):.2f} at once, on average)",
        "",
        f"{'kind':<12}{'summed s':>10}{'share':>8}{'count':>10}{'mean us':>10}",
    ]
    by_kind: dict[str, list[int]] = defaultdict(list)
    by_name: dict[str, list[int]] = defaultdict(list)
    by_pid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    if windows is not None:
        for pid in windows.inside:
            by_pid[pid] = []  # a worker idle all through the span is listed too
    for a, b, pid, name in kept:
        by_kind[kind_of(name)].append(b - a)
        by_name[name].append(b - a)
        by_pid[pid].append((a, b))
    for kind, ds in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        out.append(
            f"{kind:<12}{sum(ds) / 1e9:>10.3f}{sum(ds) / max(summed, 1):>8.1%}{len(ds):>10}"
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
    for pid, spans in sorted(by_pid.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        own = union_length(spans)
        out.append(f"  pid {pid}: {len(spans)} kernels, {own / 1e9:.3f} s ({own / span:.1%})")
        if windows is not None and pid in windows.work:
            out.append(f"    {windows.work[pid]}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="an nsys sqlite export, or Chrome traces")
    parser.add_argument("--skip-s", type=float, default=0.0, help="seconds left out at the start")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        kernels, windows = load(args.traces)
    except NotATrace as e:
        print(f"device_timeline: {e}", file=sys.stderr)
        return 2
    print("\n".join(report(kernels, args.skip_s, args.top, windows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
