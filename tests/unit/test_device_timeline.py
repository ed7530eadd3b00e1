"""``benchmarks/device_timeline.py``: a device's busy time and its kernels' kinds, from a
synthetic Nsight Systems export (the tables and columns it reads, nothing else)."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

MS = 1_000_000  # nanoseconds


def _export(path: Path, kernels: list[tuple[int, int, int, str]]) -> None:
    """Kernels as ``(start_ms, end_ms, pid, name)``, in nsys's tables."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, "
        "globalPid INTEGER, shortName INTEGER, demangledName INTEGER)"
    )
    names = sorted({k[3] for k in kernels})
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names)))
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?)",
        [(a * MS, b * MS, pid << 24, names.index(n), names.index(n)) for a, b, pid, n in kernels],
    )
    db.commit()
    db.close()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "benchmarks/device_timeline.py", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_busy_time_is_the_union_and_kinds_are_summed(tmp_path: Path) -> None:
    # 0-100 ms span; kernels cover 0-40 and 60-80 (60 ms busy), two overlap 10-30
    _export(
        tmp_path / "t.sqlite",
        [
            (0, 40, 11, "online"),
            (10, 30, 12, "store_kernel"),
            (60, 70, 12, "xqa_kernel_bf16"),
            (70, 80, 11, "elementwise_kernel"),
            (99, 100, 11, "combine"),
        ],
    )
    done = _run(str(tmp_path / "t.sqlite"), "--top", "3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "span 0.100 s" in out
    assert "some kernel running 0.061 s (61.0% of the span)" in out
    assert "summed time 0.081 s (1.33 at once" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    assert lines["oracle"][1:4] == ["0.041", "50.6%", "2"]
    assert lines["store"][1:4] == ["0.020", "24.7%", "1"]
    assert lines["flashinfer"][1:4] == ["0.010", "12.3%", "1"]
    assert lines["torch"][1:4] == ["0.010", "12.3%", "1"]
    assert "pid 11: 3 kernels, 0.051 s (51.0%)" in out
    assert "pid 12: 2 kernels, 0.030 s (30.0%)" in out
    assert out.count("] ") == 3  # --top 3


def test_kinds_by_kernel_name() -> None:
    """FlashInfer's kernels by their namespace or family; torch's and cuBLAS's batched
    kernels are not the paths' (a bare "Batch" took them until Run 48)."""
    spec = importlib.util.spec_from_file_location(
        "device_timeline", "benchmarks/device_timeline.py"
    )
    assert spec is not None and spec.loader is not None
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    kinds = {
        "void flashinfer::BatchPrefillWithPagedKVCacheKernel<KernelTraits<...>>": "flashinfer",
        "BatchDecodeWithPagedKVCacheKernel<...>": "flashinfer",
        "kernel_mha(unsigned int, unsigned int, float, float const*)": "flashinfer",
        "fmha_v2_flash_attention_bf16_64_128_S_q_paged_kv_128_sm90_kernel": "flashinfer",
        "online": "oracle",
        "store_kernel": "store",
        "void gemmSN_NN_kernel<float, 128, 2, 4, 8, 2, 4, false, "
        "cublasGemvTensorStridedBatched<float const>, float>(...)": "torch",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<...>": "torch",
        "void magma_sgemmEx_kernel<float, float, float, true, false, 6, 4, 6, 3, 4>": "torch",
    }
    assert {name: timeline.kind_of(name) for name in kinds} == kinds


def test_the_start_is_skipped(tmp_path: Path) -> None:
    _export(tmp_path / "t.sqlite", [(0, 50, 1, "online"), (100, 110, 1, "online")])
    done = _run(str(tmp_path / "t.sqlite"), "--skip-s", "0.05")
    assert done.returncode == 0, done.stderr
    assert "span 0.060 s after the first 0.05 s; 1 kernels" in done.stdout
    assert "(16.7% of the span)" in done.stdout


def test_a_file_that_is_no_export_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database")
    done = _run(str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not an Nsight Systems export" in done.stderr


def _chrome(path: Path, base_ns: int, kernels: list[tuple[float, float, str]]) -> None:
    """A torch.profiler-style Chrome trace: kernels as ``(ts_us, dur_us, name)`` after
    ``base_ns``, beside a host operator the reader must leave out."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1e9}]
    events += [
        {"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": ts, "dur": dur}
        for ts, dur, n in kernels
    ]
    path.write_text(json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events}))


def test_workers_windows_line_up_on_absolute_time_and_only_their_common_span_counts(
    tmp_path: Path,
) -> None:
    # worker 41 recorded 0-100 ms (absolute), worker 42 50-150 ms with another base: the
    # common span is 50-100 ms, where 41's kernel 60-80 and 42's 70-90 ran (one 10 ms overlap)
    _chrome(
        tmp_path / "worker-41.trace.json",
        1_000_000_000,
        [(0.0, 1000.0, "online"), (60_000.0, 20_000.0, "store_kernel"), (99_000.0, 1000.0, "x")],
    )
    _chrome(
        tmp_path / "worker-42.trace.json",
        1_040_000_000,
        [(10_000.0, 1000.0, "combine"), (30_000.0, 20_000.0, "online"), (109_000.0, 1000.0, "y")],
    )
    (tmp_path / "notes.txt").write_text("not a trace")  # a folder's other files are left alone
    done = _run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # 50-100 ms, and the kernels wholly inside it: 41's store (60-80), 41's x (99-100),
    # 42's combine (50-51), 42's online (70-90)
    assert "span 0.050 s after the first 0.0 s; 4 kernels" in out
    assert "some kernel running 0.032 s (64.0% of the span)" in out
    assert "summed time 0.042 s (1.31 at once" in out
    assert "pid 41: 2 kernels, 0.021 s" in out
    assert "pid 42: 2 kernels, 0.021 s" in out
    assert "aten::mm" not in out


def test_a_json_that_is_no_chrome_trace_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "worker-1.trace.json"
    bad.write_text('{"traceEvents": 3}')
    done = _run(str(bad))
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert "not a Chrome trace" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run(str(empty))
    assert done.returncode == 2 and "no trace files" in done.stderr


def _bounds(path: Path, pid: int, open_ms: int, close_ms: int) -> None:
    """``worker-<pid>.window.json``: a window's own bounds, as device_trace writes them."""
    bounds = {"pid": pid, "open_ns": open_ms * MS, "close_ns": close_ms * MS}
    (path / f"worker-{pid}.window.json").write_text(json.dumps(bounds))


def _windows(
    tmp_path: Path, workers: list[tuple[int, int, list[tuple[float, float, str]], int, int]]
) -> str:
    """The timeline of workers given as ``(pid, base_ns, kernels, open_ms, close_ms)``: each
    one's trace and bounds written, the report read (it must succeed)."""
    for pid, base_ns, kernels, open_ms, close_ms in workers:
        _chrome(tmp_path / f"worker-{pid}.trace.json", base_ns, kernels)
        _bounds(tmp_path, pid, open_ms, close_ms)
    done = _run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_window_counts_from_its_bounds_not_its_kernels(tmp_path: Path) -> None:
    # two workers' windows are both 0-200 ms (absolute, base 1 s), each ran one 10 ms kernel:
    # the span is the windows' 200 ms, not the kernels' 10-40 ms, and the idle time counts
    base = 1_000_000_000
    out = _windows(
        tmp_path,
        [
            (51, base, [(10_000.0, 10_000.0, "online")], 1000, 1200),
            (52, base, [(30_000.0, 10_000.0, "online")], 1000, 1200),
        ],
    )
    assert "the span 2 of 2 workers' windows share: 0.200 s" in out
    assert "span 0.200 s after the first 0.0 s; 2 kernels" in out
    assert "some kernel running 0.020 s (10.0% of the span)" in out
    assert "pid 51: 1 kernels, 0.010 s (5.0%)" in out
    assert "outside it" not in out


def test_what_a_worker_did_in_its_window_is_printed_beside_its_kernels(tmp_path: Path) -> None:
    _chrome(tmp_path / "worker-91.trace.json", 0, [(10_000.0, 5_000.0, "online")])
    bounds = {"pid": 91, "open_ns": 0, "close_ns": 2_000 * MS, "messages": 12, "cases": 190,
              "waited_s": 0.25}  # fmt: skip
    (tmp_path / "worker-91.window.json").write_text(json.dumps(bounds))
    done = _run(str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("  pid 91: 1 kernels, 0.005 s (0.2%)")
    assert lines[at + 1] == (
        "    12 launches (190 cases) in its window of 2.00 s, waiting for work 0.25 s of it"
    )


def test_a_late_window_is_named_outside_the_span_the_others_share(tmp_path: Path) -> None:
    # 61 and 62 recorded 0-100 ms, 63 (a worker started later) 500-600 ms: the span is the two
    # that overlap, 63 is named outside it, and a worker idle all through it is listed at 0
    out = _windows(
        tmp_path,
        [
            (61, 0, [(20_000.0, 50_000.0, "store_kernel")], 0, 100),
            (62, 0, [], 0, 100),
            (63, 0, [(510_000.0, 10_000.0, "online")], 500, 600),
        ],
    )
    assert "the span 2 of 3 workers' windows share: 0.100 s" in out
    assert "windows outside it (their kernels there not recorded): pid 63" in out
    assert "pid 61 0.00-0.10, pid 62 0.00-0.10, pid 63 0.50-0.60" in out
    assert "some kernel running 0.050 s (50.0% of the span)" in out
    assert "pid 62: 0 kernels, 0.000 s (0.0%)" in out
    assert "online" not in out


def test_a_kernel_across_the_spans_edge_counts_its_part_inside(tmp_path: Path) -> None:
    # windows 0-100 and 50-150 ms: 71's kernel 40-70 ms counts 20 ms of the 50-100 span
    out = _windows(
        tmp_path, [(71, 0, [(40_000.0, 30_000.0, "online")], 0, 100), (72, 0, [], 50, 150)]
    )
    assert "span 0.050 s after the first 0.0 s; 1 kernels" in out
    assert "some kernel running 0.020 s (40.0% of the span)" in out


def test_bounds_that_are_no_window_are_one_line_and_exit_2(tmp_path: Path) -> None:
    _chrome(tmp_path / "worker-81.trace.json", 0, [(0.0, 1.0, "online")])
    (tmp_path / "worker-81.window.json").write_text('{"open_ns": "soon"}')
    done = _run(str(tmp_path))
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert "not a window's bounds" in done.stderr
