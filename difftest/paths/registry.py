"""The registry of kernel paths: every implementation a case can be run through.

A path is a :class:`KernelPath` value: a name, a run function from a :class:`Batch` to an
output ``[num_query_rows, H_q, D]``, what it supports, where it can run at all, and the
precision it computes at (which decides its noise floor against the float64 oracle). Built-in
paths register themselves when :mod:`difftest.paths` is imported; users add theirs with
:func:`register_path`, from their own code or from a ``--plugin`` module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from difftest.machine import environment
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.errors import PluginError, UnknownPath
from difftest.paths.modes import PathModes

Side = Literal["decode", "prefill", "reference", "custom"]
RunFn = Callable[[Batch], torch.Tensor]
SupportsFn = Callable[[Case, torch.device], "str | None"]
AvailableFn = Callable[[torch.device], "str | None"]
BackendFn = Callable[[], "str | None"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """How a path rounds, so its noise floor can be measured the same way.

    ``p_dtype``: the dtype softmax probabilities are rounded to before ``P @ V`` (``None``:
    kept in float32). ``q_dtype``: a dtype q is rounded to before the kernel uses it (a path
    that quantises q to fp8 for an fp8 cache declares ``"fp8_e4m3"``); ``None``: as stored.
    """

    p_dtype: Literal["bf16", "fp16", "fp8_e4m3", "fp32"] = "bf16"
    q_dtype: Literal["fp8_e4m3"] | None = None


PrecisionFn = Callable[[Case], Precision]
BuildKeyFn = Callable[[Case], Hashable]


def compiles_nothing(case: Case) -> Hashable:
    """The build key of a path that compiles nothing per configuration (eager PyTorch): one
    warmup run serves every case."""
    return ()


def kernel_precision(case: Case) -> Precision:
    """The default: probabilities rounded to the query dtype, as flash-style kernels do."""
    return Precision(p_dtype=case.attention.q_dtype)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelPath:
    """One registered implementation."""

    name: str
    run: RunFn
    standalone: RunFn | None = None
    """What a standalone script (``difftest export``) runs instead of ``run``: the same kernel
    call without what only difftest's process has (caches, the device probe, contract checks);
    a module-level function, copied into the script with everything it calls. ``None``:
    ``run`` itself."""
    supports: SupportsFn | None = None
    """``(case, device) -> None`` when supported, else the reason it is not."""
    available: AvailableFn | None = None
    """``(device) -> None`` when the path can run on this machine at all, else why not."""
    side: Side = "custom"
    precision: PrecisionFn = kernel_precision
    deterministic: bool = True
    """Identical runs give identical bits (checked by the determinism rerun)."""
    description: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)
    build_key: BuildKeyFn | None = None
    """``case -> key``: cases with equal keys run the same compiled module (a JIT library
    builds one per key); omitted: the case's :meth:`Case.compile_variant`."""
    pinned_backend: str | None = None
    """The backend this path asks its library for, where the library call can choose one
    (the environment stamp lists them)."""
    backend: BackendFn | None = None
    """Asked after each successful run: the backend that actually ran it, as the library
    reports it (each result records it). A path whose library reports another backend than
    its pin raises instead of returning an output."""
    modes: PathModes = field(default_factory=PathModes)
    """Ragged batches, skip-softmax and graph capture (:mod:`difftest.paths.modes`)."""
    build_cost_s: float = 0.0
    """About how long one cold build of this path's module takes (seconds, on the H200's 16
    cores; ``docs/validation.md``), 0 for a path that builds nothing. ``difftest bisect``
    replays the repros of cheap paths first, so that one slow build cannot leave the others
    unjudged when a version's time runs out."""

    def module_key(self, case: Case) -> Hashable:
        """Which compiled module this path runs ``case`` with (warmup builds each once)."""
        return self.build_key(case) if self.build_key else case.compile_variant()

    def availability(self, device: torch.device) -> str | None:
        return self.available(device) if self.available else None

    def support(self, case: Case, device: torch.device) -> str | None:
        """``None`` when this path can run ``case`` on ``device``, else the reason."""
        reason = self.availability(device)
        if reason is None:
            reason = self.modes.reason(self.name, case, device)
        if reason is None and self.supports is not None:
            reason = self.supports(case, device)
        return reason


_REGISTRY: dict[str, KernelPath] = {}
_LOADING: list[set[str]] = []
"""While a plugin runs, the names it registers (see :func:`load_plugin`)."""


def register(path: KernelPath, *, replace: bool = False) -> KernelPath:
    """Add a :class:`KernelPath`; a second path of the same name needs ``replace=True``."""
    if path.name in _REGISTRY and not replace and _REGISTRY[path.name] is not path:
        raise ValueError(f"a path named {path.name!r} is already registered")
    _REGISTRY[path.name] = path
    if _LOADING:
        _LOADING[-1].add(path.name)
    return path


def register_path(
    name: str,
    run_fn: RunFn,
    supports: SupportsFn | None = None,
    *,
    available: AvailableFn | None = None,
    side: Side = "custom",
    precision: PrecisionFn | Precision | None = None,
    deterministic: bool = True,
    description: str = "",
    build_key: BuildKeyFn | None = None,
    modes: PathModes | None = None,
    replace: bool = True,
) -> KernelPath:
    """Register a user kernel under ``name`` (the plugin API).

    Parameters
    ----------
    name
        The path's name on the command line and in reports.
    run_fn
        ``run_fn(batch) -> Tensor[num_query_rows, H_q, D]``. Write into ``batch.new_output()``
        (NaN-filled) so rows the kernel never writes are caught.
    supports
        ``supports(case, device) -> None | str``: ``None`` if the case is supported, else the
        reason it is skipped. Omitted: every case.
    precision
        How the kernel rounds (see :class:`Precision`); omitted: probabilities in the query
        dtype. Decides the tolerance the path is held to.
    build_key
        ``build_key(case) -> hashable``: cases with equal keys run one compiled module, so
        ``difftest warmup`` builds it once; omitted: one build per compile variant.
    modes
        What the kernel does with ragged batches, the skip-softmax factor and graph replays
        (:class:`~difftest.paths.modes.PathModes`); omitted: no ragged batch, exact attention,
        called again on a graph's static buffers.
    """
    precision_fn: PrecisionFn
    if isinstance(precision, Precision):
        fixed = precision

        def precision_fn(case: Case) -> Precision:
            return fixed

    else:
        precision_fn = precision or kernel_precision
    return register(
        KernelPath(
            name=name,
            run=run_fn,
            supports=supports,
            available=available,
            side=side,
            precision=precision_fn,
            deterministic=deterministic,
            description=description,
            build_key=build_key,
            modes=modes or PathModes(),
        ),
        replace=replace,
    )


def _pinned_backends(device: object) -> str | None:
    pins = [f"{p.name}={p.pinned_backend}" for p in _REGISTRY.values() if p.pinned_backend]
    return ", ".join(pins) or None


environment.provide("backends", _pinned_backends)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_path(name: str) -> KernelPath:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPath(name, list(_REGISTRY)) from None


def all_paths() -> list[KernelPath]:
    return list(_REGISTRY.values())


def resolve(names: list[str] | None, *, tag_filter: str | None = None) -> list[KernelPath]:
    """The paths named (in that order), or every registered path without the ``mutant`` tag."""
    if names:
        return [get_path(n) for n in names]
    return [
        p
        for p in _REGISTRY.values()
        if "mutant" not in p.tags and (tag_filter is None or tag_filter in p.tags)
    ]


_PLUGIN_PATHS: dict[str, set[str]] = {}
"""The paths each loaded plugin module registered (to register them again if they were
unregistered since: a module is imported once per process)."""


def load_plugin(spec: str) -> None:
    """Import ``spec``: an importable module name or a path to a ``.py`` file. A plugin
    already imported whose paths were unregistered since is run again."""
    _LOADING.append(set())
    try:
        if spec.endswith(".py") or "/" in spec:
            file = Path(spec)
            if not file.is_file():
                raise PluginError(f"plugin file not found: {spec}")
            mod_name = f"difftest_plugin_{abs(hash(str(file.resolve())))}"
            if mod_name in sys.modules and _PLUGIN_PATHS.get(mod_name, set()) <= set(_REGISTRY):
                return
            loader_spec = importlib.util.spec_from_file_location(mod_name, file)
            if loader_spec is None or loader_spec.loader is None:
                raise PluginError(f"cannot import plugin file {spec}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
        else:
            mod_name = spec
            if mod_name in sys.modules and not _PLUGIN_PATHS.get(mod_name, set()) <= set(_REGISTRY):
                importlib.reload(sys.modules[mod_name])
            else:
                importlib.import_module(spec)
    except PluginError:
        raise
    except Exception as e:  # a plugin's own error: report it on one line
        raise PluginError(f"plugin {spec!r} failed to import: {type(e).__name__}: {e}") from e
    finally:
        registered = _LOADING.pop()
    _PLUGIN_PATHS[mod_name] = _PLUGIN_PATHS.get(mod_name, set()) | registered
