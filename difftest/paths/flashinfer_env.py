"""What every FlashInfer adapter shares: the environment probe (GPU architecture, FlashInfer
version and API shape), the per-path zeroed workspaces, and calling across API versions.
FlashInfer is imported lazily, inside functions.

Each adapter's kernel call is one plain function of the batch (and a workspace or a source of
wrappers) that needs only torch and flashinfer: the path's ``run`` calls it with this process's
cached workspaces, wrappers and contract checks, its ``standalone`` with fresh ones, and
``difftest export`` copies ``standalone`` with everything it calls into its scripts.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from difftest.machine import environment
from difftest.machine.environment import version_tuple
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths import kernel_args
from difftest.paths.flashinfer_api import FlashInferApi, QLenArg, detect
from difftest.paths.registry import KernelPath, Precision, Side

MIN_VERSION = (0, 6, 11)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashInferEnv:
    """What the support matrices need to know about the machine and the library."""

    device_type: str
    capability: tuple[int, int] | None = None
    version: str | None = None
    """``flashinfer.__version__``; ``None`` when it cannot be imported."""
    problem: str = ""
    """Why FlashInfer could not be imported."""
    api: FlashInferApi = field(default_factory=FlashInferApi)
    """What this release's API has, detected from its signatures
    (:func:`~difftest.paths.flashinfer_api.detect`)."""

    @property
    def decode_qlen_arg(self) -> QLenArg | None:
        """Where ``BatchDecodeWithPagedKVCacheWrapper`` takes ``q_len_per_req`` in this release."""
        return self.api.decode_qlen_arg

    @property
    def arch(self) -> str:
        return "no GPU" if self.capability is None else "SM{}{}".format(*self.capability)


def base_reason(env: FlashInferEnv) -> str | None:
    """Why no FlashInfer path can run here at all, or ``None``."""
    if env.device_type != "cuda" or env.capability is None:
        return f"needs a CUDA GPU (device is {env.device_type})"
    if env.version is None:
        return f"flashinfer is not importable: {env.problem}"
    if version_tuple(env.version) < MIN_VERSION:
        return f"flashinfer {env.version} is older than the supported 0.6.11"
    return None


@functools.cache
def _probe(device_type: str, index: int | None) -> FlashInferEnv:
    if device_type != "cuda" or not torch.cuda.is_available():
        return FlashInferEnv(device_type=device_type)
    capability = torch.cuda.get_device_capability(index)
    try:
        flashinfer = importlib.import_module("flashinfer")
        for module in ("decode", "prefill"):
            importlib.import_module(f"flashinfer.{module}")
    except Exception as e:  # ImportError, or a broken install raising anything
        return FlashInferEnv(
            device_type=device_type, capability=capability, version=None, problem=f"{e}"
        )
    return FlashInferEnv(
        device_type=device_type,
        capability=capability,
        version=str(flashinfer.__version__),
        api=detect(flashinfer),
    )


def probe_env(device: torch.device) -> FlashInferEnv:
    """The (cached) environment of ``device``."""
    return _probe(device.type, device.index)


def _api_note(device: torch.device | str | None) -> str | None:
    """The environment stamp's ``flashinfer_api``: what :func:`probe_env` detected."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    env = probe_env(torch.device(device))
    return env.api.describe() if env.version is not None else None


environment.provide("flashinfer_api", _api_note)


class BackendMismatch(RuntimeError):
    """A library call reports that another backend than the one the path pinned ran: the
    path would be testing another kernel under its name."""


def confirm_backend(what: str, pinned: str, reported: str | None) -> str:
    """``reported`` when it is the ``pinned`` backend, else :class:`BackendMismatch`."""
    if reported != pinned:
        raise BackendMismatch(
            f"{what} was pinned to backend={pinned!r} but reports {reported!r}: "
            "the output is another kernel's"
        )
    return reported


_RAN: dict[str, str] = {}
"""The backend each path's last run reported (read once by the path's ``backend``)."""


def note_backend(path: str, backend: str) -> None:
    _RAN[path] = backend


def ran_backend(path: str) -> str | None:
    """The backend ``path``'s last run reported, once."""
    return _RAN.pop(path, None)


_WORKSPACES: dict[tuple[str, str], torch.Tensor] = {}


def workspace(device: torch.device, owner: str) -> tuple[torch.Tensor, bool]:
    """``(buffer, first_use)``: a zeroed workspace for ``owner`` on ``device``.

    Each path family owns its buffer: XQA keeps semaphores at the start of its workspace that
    must stay zero between launches, and the wrappers write scratch there (all the cached
    wrappers one buffer, :data:`difftest.paths.flashinfer_wrappers.WRAPPERS_WORKSPACE`).
    """
    key = (str(device), owner)
    buf = _WORKSPACES.get(key)
    if buf is None:
        buf = kernel_args.zeroed_workspace(device)
        _WORKSPACES[key] = buf
        return buf, True
    return buf, False


def call_accepting(fn: Callable[..., Any], kwargs: dict[str, Any], optional: set[str]) -> Any:
    """Call ``fn(**kwargs)``, dropping the ``optional`` keys this release does not take (their
    values are what it does anyway, e.g. ``causal=True`` for a causal-only kernel)."""
    params = inspect.signature(fn).parameters
    keep = {k: v for k, v in kwargs.items() if k not in optional or k in params}
    return fn(**keep)


LimitsFn = Callable[[Case, FlashInferEnv], "str | None"]


def flashinfer_path(
    *,
    name: str,
    run: Callable[[Batch], torch.Tensor],
    standalone: Callable[[Batch], torch.Tensor],
    available: Callable[[FlashInferEnv], str | None],
    limits: LimitsFn,
    side: Side,
    precision: Callable[[Case], Precision],
    description: str,
    tags: Iterable[str],
    build_key: Callable[[Case], Hashable] | None = None,
    pinned_backend: str | None = None,
    build_cost_s: float = 0.0,
) -> KernelPath:
    """A FlashInfer kernel path: whether it runs on a device (``available``, from the probed
    library and GPU) and which cases it supports there (``limits``; the registry asks only
    once the path is available) both read one cached probe of the device. ``standalone`` is
    the same kernel call as ``run`` without this process's caches, probe and contract checks:
    what ``difftest export`` copies into its scripts. ``pinned_backend``: the backend the
    call pins, where the library could choose one; the run notes (:func:`note_backend`) the
    backend that ran, which the result records."""
    return KernelPath(
        name=name,
        run=run,
        standalone=standalone,
        supports=lambda case, device: limits(case, probe_env(device)),
        available=lambda device: available(probe_env(device)),
        side=side,
        precision=precision,
        description=description,
        tags=frozenset({"flashinfer", *tags}),
        build_key=build_key,
        pinned_backend=pinned_backend,
        backend=(lambda: ran_backend(name)) if pinned_backend is not None else None,
        build_cost_s=build_cost_s,
    )


def trtllm_gen_available(env: FlashInferEnv) -> str | None:
    reason = base_reason(env)
    if reason is None and env.capability not in ((10, 0), (10, 3)):
        return f"TRT-LLM gen kernels exist for SM100/SM103 only (this GPU is {env.arch})"
    return reason


def trtllm_gen_limits(case: Case, kernel: str) -> str | None:
    """Limits of a TRT-LLM gen ``kernel`` ("decode" or "context") as documented (not validated
    here: no SM100)."""
    a, b = case.attention, case.batch
    if b.draft.kind == "tree":
        return (
            f"TRT-LLM gen {kernel} kernel is causal only (no draft mask): tree drafts unsupported"
        )
    if a.kv_dtype not in (a.q_dtype, "fp8_e4m3"):
        return f"TRT-LLM gen needs K/V in the query dtype or fp8 (kv {a.kv_dtype})"
    if a.head_dim not in (64, 128, 256):
        return f"TRT-LLM gen cubins cover head_dim 64/128/256 (got {a.head_dim})"
    if a.page_size not in (16, 32, 64, 128):
        return f"TRT-LLM gen page_size must be 16, 32, 64 or 128 (got {a.page_size})"
    return None


def trtllm_gen_precision(case: Case) -> Precision:
    """TRT-LLM gen: P in the query dtype; with an fp8 cache the query is fp8 and so is P."""
    if case.attention.kv_dtype == "fp8_e4m3":
        return Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
    return Precision(p_dtype=case.attention.q_dtype)
