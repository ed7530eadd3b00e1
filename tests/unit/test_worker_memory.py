"""Workers that share a GPU keep to a share of its memory, and an allocation that failed is
told apart from a bug (the launch is split, the case run again; see test_packing.py for the
worker round trips)."""

from __future__ import annotations

import pytest
import torch

from difftest.execution.isolation import IsolatedExecutor
from difftest.execution.isolation.early import POOL_MEMORY, pool_memory_share
from difftest.execution.isolation.worker import WorkerSettings, out_of_memory
from difftest.paths import resolve


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.98 GiB"),
        MemoryError(),
        RuntimeError("Triton Error [CUDA]: out of memory"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported later"),
    ],
)
def test_an_allocation_that_failed_is_out_of_memory(error: BaseException) -> None:
    assert out_of_memory(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        ValueError("out of memory"),  # not an allocation's error, whatever it says
        KeyError("memory"),
    ],
)
def test_other_errors_are_not(error: BaseException) -> None:
    assert not out_of_memory(error)


def test_workers_sharing_a_gpu_each_hold_a_share_of_its_memory() -> None:
    cuda = torch.device("cuda", 0)
    assert pool_memory_share(1, cuda) is None  # one worker: the whole device
    assert pool_memory_share(8, torch.device("cpu")) is None  # host memory: not bounded
    for width in (2, 4, 8):
        share = pool_memory_share(width, cuda)
        assert share is not None
        # the pool and the session's own worker together within the pool's share
        assert share * (width + 1) == pytest.approx(POOL_MEMORY)
        assert POOL_MEMORY < 1.0


def test_the_share_goes_to_the_worker() -> None:
    """An executor's share is in the settings its worker is configured with (which a worker
    started early must match to be adopted), and its shrinker's executor has it too."""
    paths = resolve(["torch-sdpa"])
    shared = IsolatedExecutor(paths, "cpu", memory_share=0.25, spare=False)
    whole = IsolatedExecutor(paths, "cpu", spare=False)
    try:
        settings = shared._settings()
        assert settings.memory_share == 0.25
        assert settings.message()["memory_share"] == 0.25
        assert whole._settings().memory_share is None
        narrow = shared.narrowed(paths)
        assert narrow.memory_share == 0.25
        narrow.close()
        assert isinstance(settings, WorkerSettings)
    finally:
        shared.close()
        whole.close()


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_a_session_share_must_be_a_fraction(share: float) -> None:
    from difftest.execution.session import Settings
    from difftest.model.errors import SetupError

    with pytest.raises(SetupError, match="memory share"):
        Settings(device="cpu", memory_share=share)


def test_a_sessions_share_reaches_its_workers_on_a_gpu() -> None:
    """A session given a share (an xdist worker's of its GPU) passes it to its own worker and
    cuts it among a launch pool's workers; on a CPU nothing is bounded. (The device is set
    to CUDA after the session opened on the CPU: no worker starts here.)"""
    from difftest.execution.session import Session, Settings

    settings = Settings(device="cpu", paths=("torch-sdpa",), memory_share=0.2)
    with Session(settings) as session:
        assert session._make(session.runnable).memory_share is None  # type: ignore[attr-defined]
        session.device = torch.device("cuda", 0)
        own = session._make(session.runnable)
        assert own.memory_share == 0.2  # type: ignore[attr-defined]
        own.close()
        pool = session.launch_pool(3)
        shares = [e.memory_share for e in pool.executors]  # type: ignore[attr-defined]
        assert shares == [pytest.approx(0.2 / 4)] * 3
        # beside the pool, the session's own worker (rechecks, shrinking) takes the last share
        assert session.executor().memory_share == pytest.approx(0.2 / 4)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("device", "session_worker_too"), [("cuda", True), ("cpu", False)])
def test_a_pooled_gpu_campaign_starts_the_sessions_own_worker_early(
    monkeypatch: pytest.MonkeyPatch, device: str, session_worker_too: bool
) -> None:
    """On a GPU the session's own worker starts with the pool's (its first recheck would
    otherwise wait for a worker's start: about 9 s on an H200, Run 27); on a CPU it starts
    only if needed. (Nothing is spawned here: the executors' ``spawn_early`` is recorded.)"""
    from difftest.execution.session import Session, Settings

    started: list[object] = []
    monkeypatch.setattr(IsolatedExecutor, "spawn_early", lambda self: started.append(self))
    with Session(Settings(device="cpu", paths=("torch-sdpa",))) as session:
        session.device = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
        session.spawn_early(3)
        pool = session.launch_pool(3)
        assert started[:3] == list(pool.executors)
        if session_worker_too:
            assert started[3:] == [session.executor()]
        else:
            assert len(started) == 3


def test_allocator_counters_read_the_listed_counters_on_cuda_and_nothing_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from difftest.machine import memory

    assert memory.allocator_counters(torch.device("cpu")) is None
    stats = {"num_device_alloc": 12, "num_device_free": 9, "num_alloc_retries": 3}
    stats["reserved_bytes.all.current"] = 2**33
    stats["allocated_bytes.all.current"] = 2**31
    stats["active.all.current"] = 1  # not one of the listed counters
    asked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda dev: asked.append(dev) or stats)
    got = memory.allocator_counters(torch.device("cuda"))
    assert asked == [torch.device("cuda")]
    assert got == {
        "num_device_alloc": 12,
        "num_device_free": 9,
        "num_alloc_retries": 3,
        "reserved_bytes.all.current": 2**33,
        "allocated_bytes.all.current": 2**31,
    }


class _FakeAllocator:
    """``torch.cuda``'s peak statistics for the tests: each launch sets its peaks, a reset
    brings them down to what is held now."""

    def __init__(self) -> None:
        self.peaks = {"allocated_bytes.all.peak": 0, "reserved_bytes.all.peak": 0}
        self.resets = 0

    def launch(self, allocated: int, reserved: int) -> None:
        self.peaks["allocated_bytes.all.peak"] = max(
            self.peaks["allocated_bytes.all.peak"], allocated
        )
        self.peaks["reserved_bytes.all.peak"] = max(self.peaks["reserved_bytes.all.peak"], reserved)

    def memory_stats(self, dev: torch.device) -> dict[str, int]:
        return {
            **self.peaks,
            "allocated_bytes.all.current": 1,
            "reserved_bytes.all.current": 3,
            "num_device_free": 7,
        }

    def reset_peak_memory_stats(self, dev: torch.device) -> None:
        self.resets += 1
        self.peaks = {"allocated_bytes.all.peak": 1, "reserved_bytes.all.peak": 2}


def test_peaks_since_last_are_one_launchs_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    from difftest.machine import memory

    fake = _FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_stats", fake.memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    assert memory.peaks_since_last(torch.device("cpu")) is None and fake.resets == 0
    fake.launch(allocated=9 * 2**30, reserved=10 * 2**30)
    assert memory.peaks_since_last(torch.device("cuda")) == (9 * 2**30, 10 * 2**30)
    fake.launch(allocated=3 * 2**30, reserved=4 * 2**30)  # a smaller launch after it
    assert memory.peaks_since_last(torch.device("cuda")) == (3 * 2**30, 4 * 2**30)
    assert fake.resets == 2


def test_a_workers_allocator_log_has_a_line_a_launch_and_its_counters_rewritten_whole(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import os

    from difftest.execution.isolation import worker
    from difftest.execution.packing import launch_pool
    from difftest.generation.materialize import PAGE_DIM

    monkeypatch.setenv(worker.ALLOCATOR_DIR_ENV, str(tmp_path / "alloc"))
    assert worker._allocator_log(torch.device("cpu"), None) is None  # a CPU has no allocator
    assert not (tmp_path / "alloc").exists()
    fake = _FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_stats", fake.memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    log = worker._allocator_log(torch.device("cuda"), 0.094)
    assert log is not None
    launch = _a_launch()
    fake.launch(allocated=5 * 2**30, reserved=6 * 2**30)
    log.tick(launch, out_of_memory=OOM_MESSAGE + "x" * 700, path_names=["torch-sdpa"])
    fake.launch(allocated=2**30, reserved=2**31)
    log.tick(None, out_of_memory=None)  # a message whose cases were not read
    pid = os.getpid()
    names = sorted(f.name for f in (tmp_path / "alloc").iterdir())
    assert names == [f"worker-{pid}.allocator.json", f"worker-{pid}.launches.jsonl"]
    lines = [json.loads(x) for x in (tmp_path / "alloc" / names[1]).read_text().splitlines()]
    storage, _ = launch_pool(launch, torch.device("cpu"))  # what a launch allocates for it
    pool = storage.numel() * storage.element_size()
    a = launch[0].attention
    tables = [c.batch for c in launch]  # the shape, summed request by request
    requests = sum(len(b.prefix_lens) + b.padding_requests for b in tables)
    rows = sum((b.q_lens and sum(b.q_lens)) or len(b.prefix_lens) * b.q_len for b in tables)
    rows += sum(b.padding_rows + b.padding_requests * b.q_len for b in tables if not b.q_lens)
    keys = sum(p + n for b in tables for p, n in zip(b.prefix_lens, b.new_tokens(), strict=False))
    longest = max(
        p + n for b in tables for p, n in zip(b.prefix_lens, b.new_tokens(), strict=False)
    )
    pages = storage.shape[PAGE_DIM[launch[0].pool.kv_storage]]
    assert lines == [
        {
            "cases": len(launch),
            "pool_bytes": pool,
            "allocated_peak": 5 * 2**30,
            "reserved_peak": 6 * 2**30,
            "allocated_after": 1,
            "out_of_memory": True,
            "paths": ["torch-sdpa"],
            "error": (OOM_WORDS + "x" * 700)[:600],  # the allocator's words, cut
            "reserved_after_release": 3,
            "shape": {
                "dtypes": [a.q_dtype, a.kv_dtype, a.out_dtype],
                "heads": [a.num_qo_heads, a.num_kv_heads],
                "head_dim": a.head_dim,
                "page_size": a.page_size,
                "storage": launch[0].pool.kv_storage,
                "requests": requests,
                "query_rows": rows,
                "kv_tokens": keys,
                "max_seq_len": longest,
                "pages": pages,
            },
        },
        {
            "cases": None,
            "pool_bytes": None,
            "allocated_peak": 2**30,
            "reserved_peak": 2**31,
            "allocated_after": 1,
            "out_of_memory": False,
            "paths": [],
        },
    ]
    record = json.loads((tmp_path / "alloc" / names[0]).read_text())
    assert record["messages"] == 2
    assert record["memory_share"] == 0.094
    assert record["reserved_peak"] == 6 * 2**30  # the most of any launch, not the last one's
    assert record["counters"] == {
        "num_device_free": 7,
        "reserved_bytes.all.current": 3,
        "allocated_bytes.all.current": 1,
    }


OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.35 GiB. GPU 0 has a total capacity of 79.18 GiB "
    "of which 10.00 GiB is free. Process 6033 has 66.00 MiB memory in use. Process 5884 has "
    "5.96 GiB memory in use. Including non-PyTorch memory, this process has 6.44 GiB memory "
    "in use. Process 5883 has 8.10 GiB memory in use. Process 6086 has 1.07 GiB memory in use. "
    "7.48 GiB allowed; Of the allocated memory 1.94 GiB is allocated by PyTorch, and 3.84 GiB "
    "is reserved by PyTorch but unallocated. "
)
"""torch's words (2.11, eight workers under MPS, each at its share), other processes and all."""
OOM_WORDS = (
    "CUDA out of memory. Tried to allocate 2.35 GiB. GPU 0 has a total capacity of 79.18 GiB "
    "of which 10.00 GiB is free. Including non-PyTorch memory, this process has 6.44 GiB memory "
    "in use. 7.48 GiB allowed; Of the allocated memory 1.94 GiB is allocated by PyTorch, and "
    "3.84 GiB is reserved by PyTorch but unallocated. "
)


def test_allocator_words_drop_the_other_processes_and_keep_this_ones_figures() -> None:
    from difftest.machine.memory import allocator_words

    assert allocator_words(OOM_MESSAGE) == OOM_WORDS
    assert allocator_words("CUDA error: out of memory") == "CUDA error: out of memory"


def _a_launch() -> list:
    """Three cases that share a launch (the planner's, at the CPU limits)."""
    from difftest.campaign.planning import CampaignConfig, planned_cases
    from difftest.execution import packing

    config = CampaignConfig(seed=6, pack=3, cases_per_variant=2)
    planned = (case for _, case in planned_cases(config, "cpu"))
    for group in packing.group_for_launches(planned, 3):
        if len(group) == 3:
            return group
    raise AssertionError("the planner stopped")
