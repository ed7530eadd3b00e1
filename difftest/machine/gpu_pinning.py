"""Pinning pytest-xdist workers to GPUs: worker ``gwK`` gets GPU ``K % num_gpus``.

The CUDA driver reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises. So the preferred
way is to set that variable to the one chosen GPU before anything in the worker initialises
CUDA (importing torch does not; asking torch how many GPUs there are does): the worker then
sees its GPU as ``cuda:0`` and cannot touch the others. The number of GPUs is read from NVML,
which does not initialise CUDA. When CUDA is already initialised (or NVML is missing and torch
had to be asked), the variable would be ignored, so the fallback is
``torch.cuda.set_device(K % num_gpus)``: ``cuda:K'`` becomes the worker's default device.

:func:`plan_pinning` is the pure decision (tested with fake device lists); :func:`pin_worker`
gathers the facts from the process and applies it. Torch is imported only inside functions.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Literal

from difftest.model.errors import DifftestError

ENV = "CUDA_VISIBLE_DEVICES"

Method = Literal["none", "env", "set_device"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pinning:
    """The decision for one worker."""

    worker: str | None
    method: Method
    """``env``: set :data:`ENV` to ``gpu``; ``set_device``: select torch index ``gpu``."""
    gpu: str | None
    """The GPU chosen: an entry of the visible list (an index or a UUID) or a torch index."""
    device: str
    """The torch device the worker should run on: ``cuda:0`` after ``env``, ``cpu`` when
    there is no GPU, ``""`` when not under xdist (the usual default applies)."""
    reason: str
    """One line: why this choice."""
    gpus: int = 0
    """How many GPUs the workers are spread over (0: none, or not an xdist worker)."""

    def workers_sharing(self, worker_count: int) -> int:
        """How many of ``worker_count`` xdist workers (``gw0``...) share this worker's GPU,
        itself included (1 when it has none, or is not an xdist worker)."""
        k = worker_index(self.worker)
        if k is None or not self.gpus:
            return 1
        return sum(1 for j in range(max(worker_count, k + 1)) if j % self.gpus == k % self.gpus)


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` -> 3; ``None``, ``""`` or ``master`` (not under xdist) -> ``None``."""
    if worker_id in (None, "", "master"):
        return None
    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        raise DifftestError(f"unexpected xdist worker id {worker_id!r} (expected gw<N>)")
    return int(match.group(1))


def parse_visible(value: str | None) -> list[str] | None:
    """:data:`ENV` as the list of device ids it makes visible; ``None`` when unset (all).

    CUDA stops at the first invalid entry, so ``"-1"`` or ``""`` hide every GPU and
    ``"0,-1,2"`` shows only ``0``.
    """
    if value is None:
        return None
    visible = []
    for item in value.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        visible.append(item)
    return visible


def plan_pinning(
    worker_id: str | None,
    *,
    visible_env: str | None,
    gpu_count: int | None,
    driver_initialized: bool,
) -> Pinning:
    """Which GPU worker ``worker_id`` gets, and how.

    ``visible_env``: the current :data:`ENV` (``None``: unset); ``gpu_count``: how many GPUs
    the process sees (needed when ``visible_env`` is unset or the driver is initialised);
    ``driver_initialized``: CUDA has already read :data:`ENV`, so only ``set_device`` works.
    """
    k = worker_index(worker_id)
    if k is None:
        return Pinning(
            worker=worker_id, method="none", gpu=None, device="", reason="not an xdist worker"
        )
    if driver_initialized:
        if not gpu_count:
            return _no_gpu(worker_id)
        index = k % gpu_count
        return Pinning(
            worker=worker_id,
            method="set_device",
            gpu=str(index),
            device=f"cuda:{index}",
            reason=f"CUDA already initialised: torch device {index} of {gpu_count}",
            gpus=gpu_count,
        )
    visible = parse_visible(visible_env)
    ids = visible if visible is not None else [str(i) for i in range(gpu_count or 0)]
    if not ids:
        return _no_gpu(worker_id)
    chosen = ids[k % len(ids)]
    return Pinning(
        worker=worker_id,
        method="env",
        gpu=chosen,
        device="cuda:0",
        reason=f"{ENV}={chosen} ({k} mod {len(ids)} visible GPUs)",
        gpus=len(ids),
    )


def _no_gpu(worker_id: str | None) -> Pinning:
    return Pinning(worker=worker_id, method="none", gpu=None, device="cpu", reason="no GPU")


def apply_pinning(
    pinning: Pinning,
    environ: MutableMapping[str, str],
    set_device: Callable[[int], None],
) -> None:
    """Carry out ``pinning`` on ``environ`` (the process environment) or through
    ``set_device`` (``torch.cuda.set_device``)."""
    if pinning.gpu is None:
        return
    if pinning.method == "env":
        environ[ENV] = pinning.gpu
    elif pinning.method == "set_device":
        set_device(int(pinning.gpu))


def nvml_device_count() -> int | None:
    """How many GPUs NVML sees (ignores :data:`ENV`; does not initialise CUDA); ``None``
    without NVML."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        return int(count.value)
    finally:
        lib.nvmlShutdown()


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaProbe:
    """How :func:`pin_worker` asks the process about CUDA (replaceable in tests)."""

    initialized: Callable[[], bool]
    """Whether CUDA is initialised in this process (without initialising it)."""
    nvml_count: Callable[[], int | None]
    """GPUs NVML sees, without initialising CUDA; ``None`` without NVML."""
    torch_count: Callable[[], int]
    """GPUs torch sees (this initialises the driver)."""
    set_device: Callable[[int], None]


def _torch_initialized() -> bool:
    loaded = sys.modules.get("torch")
    return bool(loaded is not None and loaded.cuda.is_initialized())


def _torch_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def _torch_set_device(index: int) -> None:
    import torch

    torch.cuda.set_device(index)


REAL_PROBE = CudaProbe(
    initialized=_torch_initialized,
    nvml_count=nvml_device_count,
    torch_count=_torch_count,
    set_device=_torch_set_device,
)


def pin_worker(
    worker_id: str | None,
    environ: MutableMapping[str, str] | None = None,
    probe: CudaProbe = REAL_PROBE,
) -> Pinning:
    """Pin this xdist worker to its GPU (see the module docstring) and say how."""
    env = os.environ if environ is None else environ
    if worker_index(worker_id) is None:
        return plan_pinning(worker_id, visible_env=None, gpu_count=None, driver_initialized=False)
    initialized = probe.initialized()
    visible = env.get(ENV)
    count: int | None = None
    if not initialized and visible is None:
        count = probe.nvml_count()
    if initialized or (visible is None and count is None):
        # Asking torch initialises the driver: from here on only set_device works.
        initialized = True
        count = probe.torch_count()
    pinning = plan_pinning(
        worker_id, visible_env=visible, gpu_count=count, driver_initialized=initialized
    )
    apply_pinning(pinning, env, probe.set_device)
    return pinning


def device_identity(device: str) -> str:
    """``cuda:0 NVIDIA H200 pci 0000:19:00.0`` (the physical GPU a worker really uses), or
    the device name alone off CUDA."""
    if not device.startswith("cuda"):
        return device or "cpu"
    import torch

    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    pci = ""
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        slot = getattr(props, "pci_device_id", 0)
        pci = f" pci {domain:04x}:{bus:02x}:{slot:02x}.0"
    return f"{device} {props.name}{pci}"
