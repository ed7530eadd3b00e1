"""Worker-to-GPU pinning, with fake device lists: worker ``gwK`` gets GPU ``K % num_gpus``."""

from __future__ import annotations

from collections import Counter

import pytest

from difftest.machine.gpu_pinning import (
    ENV,
    CudaProbe,
    Pinning,
    apply_pinning,
    parse_visible,
    pin_worker,
    plan_pinning,
    worker_index,
)
from difftest.model.errors import DifftestError


def test_worker_index() -> None:
    assert worker_index("gw0") == 0
    assert worker_index("gw12") == 12
    assert worker_index("master") is None
    assert worker_index(None) is None
    assert worker_index("") is None
    with pytest.raises(DifftestError, match="unexpected xdist worker id 'node1'"):
        worker_index("node1")


@pytest.mark.parametrize(
    ("value", "visible"),
    [
        (None, None),
        ("0,1", ["0", "1"]),
        (" 2 , 3 ", ["2", "3"]),
        ("", []),
        ("-1", []),
        ("0,-1,2", ["0"]),
        ("GPU-aaa,GPU-bbb", ["GPU-aaa", "GPU-bbb"]),
        ("MIG-x", ["MIG-x"]),
    ],
)
def test_parse_visible_follows_cuda(value: str | None, visible: list[str] | None) -> None:
    assert parse_visible(value) == visible


def _plan(worker: str, env: str | None = None, count: int | None = None) -> Pinning:
    return plan_pinning(worker, visible_env=env, gpu_count=count, driver_initialized=False)


def test_eight_workers_on_two_gpus_split_evenly() -> None:
    plans = [_plan(f"gw{k}", count=2) for k in range(8)]
    assert [p.gpu for p in plans] == ["0", "1"] * 4
    assert all(p.method == "env" and p.device == "cuda:0" for p in plans)
    assert Counter(p.gpu for p in plans) == {"0": 4, "1": 4}


def test_one_worker_per_gpu_gets_distinct_gpus() -> None:
    assert [_plan(f"gw{k}", count=8).gpu for k in range(8)] == [str(i) for i in range(8)]


def test_visible_list_is_indexed_not_renumbered() -> None:
    # Already restricted to GPUs 3 and 5: workers alternate between those physical GPUs.
    assert [_plan(f"gw{k}", env="3,5").gpu for k in range(4)] == ["3", "5", "3", "5"]
    uuid = _plan("gw1", env="GPU-aaa,GPU-bbb,GPU-ccc")
    assert (uuid.gpu, uuid.reason) == ("GPU-bbb", f"{ENV}=GPU-bbb (1 mod 3 visible GPUs)")


def test_initialised_driver_falls_back_to_set_device() -> None:
    plan = plan_pinning("gw5", visible_env="0,1", gpu_count=2, driver_initialized=True)
    assert (plan.method, plan.gpu, plan.device) == ("set_device", "1", "cuda:1")


@pytest.mark.parametrize(("env", "count"), [(None, 0), ("", None), ("-1", 4)])
def test_no_gpu_means_cpu(env: str | None, count: int | None) -> None:
    plan = _plan("gw0", env=env, count=count)
    assert (plan.method, plan.gpu, plan.device) == ("none", None, "cpu")


def test_not_a_worker_is_left_alone() -> None:
    plan = _plan("master", count=4)
    assert (plan.method, plan.gpu, plan.device) == ("none", None, "")


def test_apply_sets_the_environment_or_the_device() -> None:
    calls: list[int] = []
    env: dict[str, str] = {}
    apply_pinning(_plan("gw3", count=2), env, calls.append)
    assert env == {ENV: "1"} and calls == []
    apply_pinning(
        plan_pinning("gw3", visible_env=None, gpu_count=2, driver_initialized=True),
        env,
        calls.append,
    )
    assert calls == [1] and env == {ENV: "1"}
    apply_pinning(_plan("gw0", count=0), env, calls.append)
    assert calls == [1] and env == {ENV: "1"}


class FakeCuda:
    """A process with ``gpus`` GPUs, NVML present or not, CUDA initialised or not."""

    def __init__(self, gpus: int, *, nvml: bool, initialized: bool) -> None:
        self.gpus, self.nvml, self.is_initialized = gpus, nvml, initialized
        self.selected: list[int] = []

    def probe(self) -> CudaProbe:
        def torch_count() -> int:
            self.is_initialized = True  # as cudaGetDeviceCount does
            return self.gpus

        return CudaProbe(
            initialized=lambda: self.is_initialized,
            nvml_count=lambda: self.gpus if self.nvml else None,
            torch_count=torch_count,
            set_device=self.selected.append,
        )


def test_pin_worker_uses_nvml_and_the_environment_before_cuda_starts() -> None:
    cuda = FakeCuda(4, nvml=True, initialized=False)
    env: dict[str, str] = {}
    pinning = pin_worker("gw6", env, cuda.probe())
    assert (pinning.method, pinning.gpu, env) == ("env", "2", {ENV: "2"})
    assert not cuda.is_initialized and cuda.selected == []


def test_pin_worker_respects_an_existing_visible_list() -> None:
    cuda = FakeCuda(8, nvml=True, initialized=False)
    env = {ENV: "4,6"}
    assert pin_worker("gw1", env, cuda.probe()).gpu == "6"
    assert env == {ENV: "6"}


def test_pin_worker_without_nvml_selects_the_device() -> None:
    cuda = FakeCuda(2, nvml=False, initialized=False)
    env: dict[str, str] = {}
    pinning = pin_worker("gw3", env, cuda.probe())
    assert (pinning.method, pinning.device, cuda.selected, env) == ("set_device", "cuda:1", [1], {})


def test_pin_worker_after_cuda_started_selects_the_device() -> None:
    cuda = FakeCuda(3, nvml=True, initialized=True)
    env = {ENV: "0,1,2"}
    pinning = pin_worker("gw4", env, cuda.probe())
    assert (pinning.method, cuda.selected, env) == ("set_device", [1], {ENV: "0,1,2"})


def test_pin_worker_outside_xdist_touches_nothing() -> None:
    cuda = FakeCuda(2, nvml=True, initialized=False)
    env: dict[str, str] = {}
    assert pin_worker(None, env, cuda.probe()).method == "none"
    assert env == {} and cuda.selected == [] and not cuda.is_initialized


def test_the_workers_that_share_a_gpu_are_counted() -> None:
    """``pytest -n 16`` on one GPU: all sixteen share it; eight workers on two GPUs: four
    each; three on two: the even workers two, the odd one alone; no GPU or not a worker: 1."""
    assert _plan("gw5", count=1).workers_sharing(16) == 16
    assert [_plan(f"gw{k}", count=2).workers_sharing(8) for k in range(8)] == [4] * 8
    assert [_plan(f"gw{k}", env="3,5").workers_sharing(3) for k in range(3)] == [2, 1, 2]
    set_device = plan_pinning("gw2", visible_env=None, gpu_count=2, driver_initialized=True)
    assert set_device.workers_sharing(6) == 3
    assert _plan("gw0", count=0).workers_sharing(8) == 1
    assert _plan("master", count=4).workers_sharing(8) == 1
    # a count below the worker's own index (cannot happen under xdist) still counts itself
    assert _plan("gw9", count=1).workers_sharing(4) == 10


def test_xdist_workers_sharing_a_gpu_each_get_a_share_of_its_memory() -> None:
    import torch

    from difftest.execution.isolation.early import POOL_MEMORY, pool_memory_share
    from difftest.interfaces.pytest_plugin.hooks import shared_gpu_memory

    cuda = torch.device("cuda", 0)
    assert shared_gpu_memory(_plan("gw3", count=1), 16, cuda) == pytest.approx(POOL_MEMORY / 16)
    assert shared_gpu_memory(_plan("gw3", count=2), 8, cuda) == pytest.approx(POOL_MEMORY / 4)
    assert shared_gpu_memory(_plan("gw1", count=8), 8, cuda) is None  # a GPU to itself
    assert shared_gpu_memory(_plan("gw1", count=0), 8, torch.device("cpu")) is None
    # a session given a share cuts it among its launch pool's workers and its own
    share = POOL_MEMORY / 16
    assert pool_memory_share(1, cuda, share) == share
    assert pool_memory_share(3, cuda, share) == pytest.approx(share / 4)
    assert pool_memory_share(3, torch.device("cpu"), share) is None
