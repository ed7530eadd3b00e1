"""How busy a command's processes keep their cores, sampled from ``/proc`` while it runs.

    python benchmarks/sample_processes.py [--every 0.5] [--gpu] OUTPUT -- COMMAND [ARGS...]

Runs ``COMMAND`` and, every ``--every`` seconds until it ends, reads the CPU time of it and of
each process below it (``/proc/PID/stat``: user and system time; and of each thread of the
command's own process, ``/proc/PID/task``), and with ``--gpu`` the device's utilisation as
``nvidia-smi`` reports it. Writes ``OUTPUT`` (JSON: every sample) and prints a summary: for the
command's process, its threads and its descendants, the CPU seconds each used and the share of
the wall that is (100 % = one core kept busy). The question it answers for a pooled bench is
which side waits: a parent near 100 % (or its threads near 100 % together, under one
interpreter lock) limits the workers; workers well under 100 % while the device is busy are
waiting for the device. Exits with the command's status. Linux only; no assertion: for
reading. SIGINT and SIGTERM are ignored here once the command runs: they reach the command
too (a process group's signal, as ``timeout`` and a terminal send it), and this process waits
for it to end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROCESSES_LISTED = 12
"""The busiest processes the summary lists one by one (a bench that compiles starts dozens)."""


def _stat(path: Path) -> tuple[str, int, float] | None:
    """(name, parent pid, CPU seconds) from a ``stat`` file, ``None`` if it has gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    # the name is in parentheses and may hold spaces: split after its closing one
    close = text.rfind(")")
    name = text[text.find("(") + 1 : close]
    fields = text[close + 2 :].split()
    # fields[0] is the state (stat's third field): utime and stime are stat's 14th and 15th
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _tree(root: int) -> dict[int, tuple[str, float]]:
    """Each live process under ``root`` (itself included): its name and CPU seconds."""
    table: dict[int, tuple[str, int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            got = _stat(entry / "stat")
            if got is not None:
                table[int(entry.name)] = got
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, tuple[str, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            name, _, cpu = table[pid]
            found[pid] = (name, cpu)
            todo.extend(children.get(pid, []))
    return found


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        got = _stat(task / "stat")
        if got is not None:
            out[int(task.name)] = (got[0], got[2])
    return out


class _GpuSampler(threading.Thread):
    """``nvidia-smi``'s utilisation, a reading each ``every`` seconds."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.readings: list[tuple[float, float]] = []
        self.every = every
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.wait(self.every):
            try:
                text = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                self.readings.append((time.monotonic() - start, float(text.split()[0])))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return


def _windows(
    samples: list[dict[str, object]],
    names: dict[int, tuple[str, float]],
    command: int,
    gpu: list[tuple[float, float]],
    width: float,
) -> None:
    """The share of a core each process (the ten busiest) used in each ``width`` seconds, and
    the device's mean utilisation there: a table, a column a window."""
    if len(samples) < 2:
        return
    end = float(samples[-1]["t"])  # type: ignore[arg-type]
    edges = [i * width for i in range(int(end // width) + 1)] + [end]
    edges = sorted(set(edges))

    def cpu_at(pid: str, t: float) -> float | None:
        """The pid's CPU seconds at the last sample at or before ``t``."""
        got = None
        for s in samples:
            if float(s["t"]) > t:  # type: ignore[arg-type]
                break
            got = s["cpu"].get(pid, got)  # type: ignore[union-attr]
        return got

    top = sorted(names.items(), key=lambda kv: -kv[1][1])[:10]
    head = "".join(f"{f'{a:.0f}-{b:.0f}s':>9}" for a, b in itertools.pairwise(edges))
    print(f"  CPU share of a core per window{'':<8}{head}")
    for pid, (name, _) in top:
        cells = []
        for a, b in itertools.pairwise(edges):
            x, y = cpu_at(str(pid), a), cpu_at(str(pid), b)
            cells.append(f"{(y - (x or 0.0)) / (b - a):9.0%}" if y is not None else f"{'-':>9}")
        label = f"{'command' if pid == command else 'child'} {pid} {name}"[:38]
        print(f"  {label:<38}{''.join(cells)}")
    if gpu:
        cells = []
        for a, b in itertools.pairwise(edges):
            inside = [u for t, u in gpu if a <= t < b]
            cells.append(f"{sum(inside) / len(inside):8.0f}%" if inside else f"{'-':>9}")
        print(f"  {'gpu utilisation':<38}{''.join(cells)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--gpu", action="store_true", help="also sample nvidia-smi's utilisation")
    parser.add_argument(
        "--window", type=float, default=5.0, help="seconds a column of the summary's table spans"
    )
    parser.add_argument("output", type=Path, help="where the samples go (JSON)")
    parser.add_argument("command", nargs="*", help="-- COMMAND [ARGS...]")
    # the command is everything after the first "--": this script's options may come
    # before or after the output file
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    command = args.command + argv[cut + 1 :]
    if not command:
        print("sample_processes: no command given (-- COMMAND [ARGS...])", file=sys.stderr)
        return 2
    gpu = _GpuSampler(args.every) if args.gpu else None
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        print(f"sample_processes: cannot start {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 2
    # An interrupt or a `timeout` reaches the whole process group, the command included, which
    # winds down on its own: this process outlives it to write what it sampled. (Killed first,
    # it lost the samples and the command's last output came after the caller's next step.)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if gpu is not None:
        gpu.start()
    samples: list[dict[str, object]] = []
    last: dict[int, tuple[str, float]] = {}
    threads_last: dict[int, tuple[str, float]] = {}
    first_seen: dict[int, float] = {}
    last_seen: dict[int, float] = {}
    while proc.poll() is None:
        now = time.monotonic() - start
        tree = _tree(proc.pid)
        threads = _threads(proc.pid)
        for pid in tree:
            first_seen.setdefault(pid, now)
            last_seen[pid] = now
        if tree:
            last.update(tree)
        if threads:
            threads_last.update(threads)
        samples.append(
            {
                "t": round(now, 3),
                "cpu": {str(p): round(c, 2) for p, (_, c) in tree.items()},
                "threads": {str(t): round(c, 2) for t, (_, c) in threads.items()},
            }
        )
        time.sleep(args.every)
    wall = time.monotonic() - start
    if gpu is not None:
        gpu.stop.set()
        gpu.join(timeout=10)
    args.output.write_text(
        json.dumps(
            {
                "command": command,
                "pid": proc.pid,
                "wall_s": wall,
                "samples": samples,
                "names": {str(p): n for p, (n, _) in last.items()},
                "gpu": gpu.readings if gpu is not None else None,
            }
        )
    )
    print(
        f"sample_processes: {wall:.1f} s wall, {len(samples)} samples of {' '.join(command)[:80]}"
    )
    busiest = sorted(last.items(), key=lambda kv: -kv[1][1])
    for pid, (name, cpu) in busiest[:PROCESSES_LISTED]:
        # from its first sample to its last (the command's to the end), one interval at least:
        # a compiler that lived two seconds is not spread over the whole wall
        end = wall if pid == proc.pid else last_seen[pid] + args.every
        alive = max(end - first_seen[pid], args.every)
        role = "command" if pid == proc.pid else "child"
        print(
            f"  {role:<7} {pid:>7} {name:<16} {cpu:8.2f} s CPU, "
            f"{cpu / alive:6.1%} of its {alive:.1f} s"
        )
    if len(busiest) > PROCESSES_LISTED:
        rest = sum(cpu for _, (_, cpu) in busiest[PROCESSES_LISTED:])
        print(f"  ... {len(busiest) - PROCESSES_LISTED} more processes, {rest:.2f} s CPU together")
    for tid, (name, cpu) in sorted(threads_last.items(), key=lambda kv: -kv[1][1])[:8]:
        share = cpu / max(wall, 1e-9)
        print(f"  thread  {tid:>7} {name:<16} {cpu:8.2f} s CPU, {share:6.1%} of the wall")
    _windows(samples, last, proc.pid, gpu.readings if gpu is not None else [], args.window)
    if gpu is not None and gpu.readings:
        busy = [u for _, u in gpu.readings]
        print(
            f"  gpu utilisation: mean {sum(busy) / len(busy):.0f} %, "
            f"{sum(u >= 90 for u in busy)} of {len(busy)} readings >= 90 %"
        )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
