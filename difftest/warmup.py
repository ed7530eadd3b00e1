"""Compile ahead: run every path once per compile variant a campaign will need.

FlashInfer builds one JIT module per kernel configuration (tens of seconds to minutes each,
cold) into an on-disk cache. Warming up compiles them before the campaign, so that campaign
timings measure kernels, not compilers: in threads, one path per thread (the builds run in
ninja subprocesses), or in spawned processes, one (path, variant) build each, so that one
path's variants build side by side too (the library's file locks keep two processes from
building one module twice; each process has its own path state).
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from difftest.case import Case
from difftest.materializer import materialize
from difftest.paths.registry import KernelPath


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupResult:
    path: str
    variant: str
    seconds: float
    error: str = ""


def distinct_variants(cases: Iterable[Case], limit: int) -> list[Case]:
    """The first case of each of the first ``limit`` compile variants, in order."""
    seen: dict[tuple[object, ...], Case] = {}
    for case in cases:
        key = case.compile_variant()
        if key not in seen:
            seen[key] = case
            if len(seen) >= limit:
                break
    return list(seen.values())


def describe(case: Case) -> str:
    a = case.attention
    window = "window" if a.window_left >= 0 else "full"
    return (
        f"{a.num_qo_heads}:{a.num_kv_heads} d{a.head_dim} ps{a.page_size} "
        f"{a.q_dtype}/{a.kv_dtype} L{case.batch.q_len} {window}"
        f"{' sinks' if a.sinks else ''}{' tree' if case.batch.draft.kind == 'tree' else ''}"
    )


def _one(path: KernelPath, case: Case, device: torch.device) -> WarmupResult:
    start = time.perf_counter()
    error = ""
    try:
        path.run(materialize(case, device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a failed build is reported, not fatal: the campaign will see it
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return WarmupResult(
        path=path.name, variant=describe(case), seconds=time.perf_counter() - start, error=error
    )


def warm_up(
    variants: Sequence[Case], paths: Sequence[KernelPath], device: torch.device, jobs: int = 4
) -> list[WarmupResult]:
    """Run each supporting path once on each variant's case, up to ``jobs`` paths at a time.

    Different paths build in parallel; one path's variants run one after another, because a
    path's cached state (a planned wrapper, a workspace with semaphores) is not thread-safe:
    two threads planning one fa2 wrapper for different dtypes fail, and two XQA launches
    sharing one workspace race on its semaphores.
    """

    def one_path(path: KernelPath) -> list[WarmupResult]:
        return [_one(path, case, device) for case in variants if path.support(case, device) is None]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(itertools.chain.from_iterable(pool.map(one_path, paths)))


def warm_up_in_processes(
    variants: Sequence[Case],
    paths: Sequence[KernelPath],
    device: torch.device,
    processes: int,
    plugins: Sequence[str] = (),
    on_result: Callable[[WarmupResult], None] | None = None,
) -> list[WarmupResult]:
    """Like :func:`warm_up`, each (path, variant) build in one of ``processes`` spawned
    processes (``plugins``: imported there, so plugin paths resolve). Builds are ordered
    variant-major, so every path's first variant starts early. ``on_result``: called with
    each build as it finishes (builds take minutes; the caller may report progress)."""
    jobs = [
        (path.name, case.to_json())
        for case in variants
        for path in paths
        if path.support(case, device) is None
    ]
    if not jobs:
        return []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=max(1, min(processes, len(jobs))),
        mp_context=context,
        initializer=_process_init,
        initargs=(tuple(plugins),),
    ) as pool:
        futures = [pool.submit(_process_build, name, case, str(device)) for name, case in jobs]
        if on_result is not None:
            for done in as_completed(futures):
                on_result(done.result())
        return [f.result() for f in futures]


def _process_init(plugins: tuple[str, ...]) -> None:
    from difftest.paths import load_plugin

    for spec in plugins:
        load_plugin(spec)


def _process_build(name: str, case_json: dict[str, object], device: str) -> WarmupResult:
    from difftest.paths import get_path

    return _one(get_path(name), Case.from_json(case_json), torch.device(device))
