"""Running one fuzzed repro file through ``difftest replay``, ``explain``, ``shrink`` and
``export`` in this process, and what each run must satisfy.

Every run must exit 0, 1 or 2, print no traceback and no "internal error", finish within
:data:`TIME_LIMIT_S` and grow the process's peak memory by at most :data:`MEMORY_LIMIT_MB`. A
run still going after :data:`HANG_S` is stopped by a ``SIGALRM`` and counted as a hang.

The machine the commands see has :data:`FREE_MEMORY` bytes free (``caps.free_memory`` is
patched): a case within the static caps but over half of that is refused by
:func:`difftest.records.untrusted.check_fits`, as it would be on a machine that small. Paths
run in this process (``--isolation none``, ``--device cpu``): the seed repros' paths are all
registered up front (the planted, mutant and launch-slot plugins), except that the two mutants
that kill or stall their process are stood in for by a correct kernel under their names.

:class:`Stats` keeps the counts of every run of the session; the fuzz folder's conftest prints
them at the end (inputs, runs per command and exit code, tracebacks, hangs, slowest run, peak
memory growth).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import resource
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent / "seeds"
PLANTED_FILE = ROOT / "tests" / "fixtures" / "planted.py"
SLOTS_FILE = ROOT / "tests" / "fixtures" / "launch_slots.py"

TIME_LIMIT_S = 10.0
HANG_S = 30.0
MEMORY_LIMIT_MB = 500.0
MAX_ERROR_CHARS = 4000
"""The most a refusal may print on stderr (one line naming the file and the field: never the
file's content echoed back)."""
FREE_MEMORY = 512 << 20
"""What the fuzzed commands are told the machine has free (the caps module is patched)."""

COMMANDS = ("replay", "explain", "shrink", "export")
COMMON = ("--isolation", "none", "--device", "cpu")
SHRINK_BUDGET = ("--max-runs", "3", "--max-seconds", "2")
KILLERS = ("mutant-crash-long-table", "mutant-hang-large-group")
"""Mutants that abort or deadlock the process: stood in for by a correct kernel here."""


def seed_files() -> list[Path]:
    """The real repros the fuzzer mutates: one of each finding kind here (CRASH and HANG from
    an isolated CPU campaign of the mutants, a pending one, a packed launch, one with a tensor
    sidecar, NONFINITE edited from a WRONG one; the ``wrong-fp8-*`` and ``wrong-tree-*`` ones
    are unshrunk findings of CPU campaigns of ``mutant-fp8-scale-twice`` (``--seed 3``) and
    ``mutant-draft-mask-ignored`` (``--seed 5``) with ``--shrink-runs 1``: fp8 caches with
    their scales, a window, padding requests and rows, ragged prefixes, a tree draft, SGLang's
    convention), the planted corpus and the package corpus."""
    return [
        *sorted(SEEDS.glob("*.repro.json")),
        *sorted((ROOT / "tests" / "corpus").glob("*.repro.json")),
        *sorted((ROOT / "difftest" / "corpus").glob("*.repro.json")),
    ]


class FuzzHang(BaseException):
    """Raised by the watchdog in a run that took more than :data:`HANG_S` (a ``BaseException``:
    nothing in difftest catches it)."""


@dataclass
class Run:
    """One command on one input."""

    command: str
    code: int
    seconds: float
    peak_mb: float
    stdout: str
    stderr: str
    hang: bool = False

    def problems(self) -> list[str]:
        found = []
        if self.hang:
            found.append(f"hang: stopped after {self.seconds:.1f}s")
        elif self.code not in (0, 1, 2):
            found.append(f"exit code {self.code}")
        if "Traceback" in self.stderr or "internal error" in self.stderr:
            found.append("traceback")
        elif len(self.stderr) > MAX_ERROR_CHARS:
            found.append(f"{len(self.stderr)} characters on stderr")
        if self.seconds > TIME_LIMIT_S:
            found.append(f"took {self.seconds:.1f}s > {TIME_LIMIT_S}s")
        if self.peak_mb > MEMORY_LIMIT_MB:
            found.append(f"peak memory grew {self.peak_mb:.0f} MB > {MEMORY_LIMIT_MB} MB")
        return found


@dataclass
class Stats:
    """Counts over every fuzzed run of the session."""

    inputs: int = 0
    runs: Counter[tuple[str, int]] = field(default_factory=Counter)
    tracebacks: int = 0
    hangs: int = 0
    over_time: int = 0
    over_memory: int = 0
    slowest_s: float = 0.0
    slowest: str = ""
    peak_mb: float = 0.0
    peak: str = ""
    seconds: float = 0.0
    command_seconds: Counter[str] = field(default_factory=Counter)

    def add(self, label: str, run: Run) -> None:
        self.runs[(run.command, run.code)] += 1
        self.seconds += run.seconds
        self.command_seconds[run.command] += run.seconds
        self.tracebacks += "traceback" in run.problems()
        self.hangs += run.hang
        self.over_time += run.seconds > TIME_LIMIT_S
        self.over_memory += run.peak_mb > MEMORY_LIMIT_MB
        if run.seconds > self.slowest_s:
            self.slowest_s, self.slowest = run.seconds, f"{run.command} {label}"
        if run.peak_mb > self.peak_mb:
            self.peak_mb, self.peak = run.peak_mb, f"{run.command} {label}"

    def lines(self) -> list[str]:
        codes: Counter[int] = Counter()
        for (_, code), n in self.runs.items():
            codes[code] += n
        per_command = "; ".join(
            f"{c}: "
            + ", ".join(
                f"exit {code} x{n}" for (cmd, code), n in sorted(self.runs.items()) if cmd == c
            )
            for c in COMMANDS
            if any(cmd == c for cmd, _ in self.runs)
        )
        return [
            f"repro fuzz: {self.inputs} inputs, {sum(self.runs.values())} runs "
            f"({self.seconds:.0f}s in the commands: "
            + ", ".join(f"{c} {self.command_seconds[c]:.0f}s" for c in COMMANDS)
            + ")",
            "  exit codes: " + ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())),
            f"  per command: {per_command}",
            f"  tracebacks: {self.tracebacks}, hangs: {self.hangs}, over {TIME_LIMIT_S:g}s: "
            f"{self.over_time}, over {MEMORY_LIMIT_MB:g} MB: {self.over_memory}",
            f"  slowest run: {self.slowest_s:.2f}s ({self.slowest[:120]})",
            f"  largest peak memory growth: {self.peak_mb:.0f} MB ({self.peak[:120]})",
        ]


STATS = Stats()


@dataclass
class Refusals:
    """The named hostile inputs' runs: how long each took and how much peak memory it grew."""

    runs: list[tuple[str, float, float]] = field(default_factory=list)

    def add(self, label: str, run: Run) -> None:
        self.runs.append((label, run.seconds, run.peak_mb))

    def lines(self) -> list[str]:
        slowest = max(self.runs, key=lambda r: r[1])
        largest = max(self.runs, key=lambda r: r[2])
        return [
            f"named inputs: {len(self.runs)} refusals checked; slowest {slowest[1]:.3f}s "
            f"({slowest[0]}), largest peak memory growth {largest[2]:.0f} MB ({largest[0]})",
            *(f"  {label}: {s:.3f}s, {mb:.0f} MB" for label, s, mb in self.runs),
        ]


REFUSALS = Refusals()


# -- measuring -------------------------------------------------------------------------------


def _status_kb(key: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux: ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def peak_growth() -> Iterator[list[float]]:
    """Yields a list that holds, afterwards, how many MB the peak RSS rose above the RSS at
    the start (``VmHWM`` after a reset where Linux allows it, else ``ru_maxrss``)."""
    out: list[float] = []
    reset = _reset_peak()
    start = _status_kb("VmRSS") if reset else None
    before_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        yield out
    finally:
        hwm = _status_kb("VmHWM") if reset else None
        if start is not None and hwm is not None:
            out.append(max(0, hwm - start) / 1024)
        else:
            after_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            out.append(max(0, after_max - before_max) / 1024)


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise :class:`FuzzHang` in this (main) thread after ``seconds``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(signum: int, frame: FrameType | None) -> None:
        raise FuzzHang

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_command(argv: Sequence[str]) -> Run:
    """``difftest ARGV`` in this process, measured."""
    from difftest.interfaces.cli import main

    out, err = io.StringIO(), io.StringIO()
    hang = False
    code = -1
    start = time.perf_counter()
    with peak_growth() as peak:
        try:
            with watchdog(HANG_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(list(argv))
        except FuzzHang:
            hang = True
    seconds = time.perf_counter() - start
    return Run(argv[0], code, seconds, peak[0], out.getvalue(), err.getvalue(), hang)


# -- the registry the commands see -----------------------------------------------------------


@contextlib.contextmanager
def fuzz_registry() -> Iterator[None]:
    """Every path the seeds name registered (killers stood in for), ``caps.free_memory``
    patched to :data:`FREE_MEMORY`, the command-line parser built once, one torch thread; all
    restored afterwards."""
    import torch

    import difftest.calibration.mutants  # noqa: F401  (registers the mutants)
    from difftest.interfaces import cli
    from difftest.model import caps
    from difftest.paths import load_plugin
    from difftest.paths.registry import _REGISTRY, get_path, register

    before = dict(_REGISTRY)
    load_plugin(str(PLANTED_FILE))
    load_plugin(str(SLOTS_FILE))
    import difftest.calibration.mutants as mutants

    for m in mutants.MUTANTS:
        register(m.path(), replace=True)
    correct = get_path("torch-paged-online")
    for name in KILLERS:
        register(dataclasses.replace(get_path(name), run=correct.run), replace=True)
    wanted = dict(_REGISTRY)
    free_memory = caps.free_memory
    build_parser = cli.build_parser
    parser = build_parser()
    cli.build_parser = lambda: parser  # built once: argparse takes half the time of a refusal
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    caps.free_memory = lambda device_type, index=None: FREE_MEMORY
    global _WANTED
    _WANTED = wanted
    try:
        yield
    finally:
        _WANTED = {}
        caps.free_memory = free_memory
        cli.build_parser = build_parser
        torch.set_num_threads(threads)
        _REGISTRY.clear()
        _REGISTRY.update(before)


_WANTED: dict[str, Any] = {}


def _ensure_registry() -> None:
    """Put back what a command (or another test in this process) changed in the registry:
    a killer mutant must never run here."""
    from difftest.paths.registry import _REGISTRY

    assert _WANTED, "fuzz_registry() is not active"
    if any(_REGISTRY.get(k) is not v for k, v in _WANTED.items()) or len(_REGISTRY) != len(_WANTED):
        _REGISTRY.clear()
        _REGISTRY.update(_WANTED)


# -- one input -------------------------------------------------------------------------------


@dataclass
class Workspace:
    """A folder the fuzzed file is written into (with the seed's sidecar next to it)."""

    root: Path

    def file(self, data: bytes, seed: Path | None) -> Path:
        folder = _emptied(self.root / "in")
        if seed is not None:
            for sidecar in seed.parent.glob(seed.name.removesuffix(".json") + "*.safetensors"):
                shutil.copy(sidecar, folder / sidecar.name)
        target = folder / (seed.name if seed is not None else "fuzz.repro.json")
        target.write_bytes(data)
        return target

    def out(self) -> Path:
        return _emptied(self.root / "out")


def _emptied(folder: Path) -> Path:
    """``folder``, created or emptied of the files a run left (removing the folder itself
    each time is slow on some file systems)."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return folder


def argv_for(command: str, file: Path, out: Path, extra: Sequence[str] = ()) -> list[str]:
    argv = [command, str(file), *COMMON, *extra]
    if command == "export":
        return [command, str(file), "-o", str(out / "script.py"), *extra]
    if command == "shrink":
        argv += [*SHRINK_BUDGET, "--out", str(out)]
    return argv


def run_input(
    ws: Workspace,
    data: bytes,
    label: str,
    *,
    seed: Path | None = None,
    commands: Sequence[str] = COMMANDS,
    stats: Stats = STATS,
) -> list[str]:
    """Write ``data`` as a repro file and run each of ``commands`` on it; the problems found
    (empty when every run is as it must be), each naming the command and ``label``."""
    file = ws.file(data, seed)
    stats.inputs += 1
    problems = []
    for command in commands:
        _ensure_registry()
        run = run_command(argv_for(command, file, ws.out()))
        stats.add(label, run)
        for problem in run.problems():
            tail = run.stderr.strip().splitlines()[-3:]
            problems.append(f"{command} [{label}]: {problem}: {' | '.join(tail)[:600]}")
    return problems


def files_equal(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


def env_profile() -> str:
    return os.environ.get("DIFFTEST_FUZZ", "ci")
