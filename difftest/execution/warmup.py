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
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import torch

from difftest.generation.materialize import materialize
from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.oracle import fused
from difftest.paths.registry import KernelPath

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupResult:
    path: str
    variant: str
    seconds: float
    error: str = ""


def cases_of_variants(cases: Iterable[Case], limit: int) -> list[Case]:
    """The cases (in order) of the first ``limit`` compile variants, up to the first case of a
    further one: a plan lists a template's runtime variations together, and they may still
    differ in what a path compiles (the KV layout FMHAv2 is built for follows the storage and
    the convention)."""
    kept: set[tuple[object, ...]] = set()
    out = []
    for case in cases:
        key = case.compile_variant()
        if key not in kept:
            if len(kept) >= limit:
                break
            kept.add(key)
        out.append(case)
    return out


def builds(
    cases: Iterable[Case], paths: Sequence[KernelPath], device: torch.device
) -> list[tuple[KernelPath, Case]]:
    """One (path, case) per module a path will build for ``cases`` (its
    :meth:`KernelPath.module_key`), the first case that needs it, in case order: two builds
    of one module would only wait on each other's lock."""
    seen: set[tuple[str, object]] = set()
    out = []
    for case in cases:
        for path in paths:
            if path.support(case, device) is not None:
                continue
            key = (path.name, path.module_key(case))
            if key not in seen:
                seen.add(key)
                out.append((path, case))
    return out


def describe(case: Case) -> str:
    a = case.attention
    window = "window" if a.window_left >= 0 else "full"
    return (
        f"{a.num_qo_heads}:{a.num_kv_heads} d{a.head_dim} ps{a.page_size} "
        f"{a.q_dtype}/{a.kv_dtype} L{case.batch.q_len} {window}"
        f"{' sinks' if a.sinks else ''}{' tree' if case.batch.draft.kind == 'tree' else ''}"
    )


def _one(path: KernelPath, case: Case, device: torch.device) -> WarmupResult:
    """``path`` run once on ``case`` (its module built or loaded), then, on a GPU, the oracle
    once on the same batch (:func:`_oracle_kernels`); the time is both's."""
    start = time.perf_counter()
    error = ""
    try:
        batch = materialize(case, device)
        path.run(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # a failed build is reported, not fatal: the campaign will see it
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    else:
        _oracle_kernels(path, batch, device)
    return WarmupResult(
        path=path.name, variant=describe(case), seconds=time.perf_counter() - start, error=error
    )


def _oracle_kernels(path: KernelPath, batch: Batch, device: torch.device) -> None:
    """On a GPU, the oracle once over ``batch`` at ``path``'s precision, as a launch of the
    campaign runs it: the fused oracle's Triton kernels for the batch's variant, and those its
    first-use check runs, compile here, into Triton's on-disk cache, so that a campaign's
    workers load them and do not each compile them at their first case (a four-worker bench
    whose warmup left them out spent its first 14 s with its four workers compiling the same
    kernels side by side: Run 36). Its output is dropped; a failure here is not the path's
    build's, and the campaign's own oracle meets and reports it."""
    if device.type != "cuda":
        return  # nothing to compile: the oracle runs in torch on a CPU
    try:
        with torch.inference_mode():
            compare.oracle_outputs(batch, [path.precision(batch.case)], fused.batched_attention)
        torch.cuda.synchronize(device)
    except Exception as exc:
        log.warning(
            "warmup: the oracle failed on %s (%s: %s)",
            describe(batch.case),
            type(exc).__name__,
            exc,
        )


def warm_up(
    cases: Sequence[Case], paths: Sequence[KernelPath], device: torch.device, jobs: int = 4
) -> list[WarmupResult]:
    """Run each supporting path once per module it builds for ``cases`` (:func:`builds`), up
    to ``jobs`` paths at a time.

    Different paths build in parallel; one path's modules build one after another, because a
    path's cached state (a planned wrapper, a workspace with semaphores) is not thread-safe:
    two threads planning one fa2 wrapper for different dtypes fail, and two XQA launches
    sharing one workspace race on its semaphores.
    """

    planned = builds(cases, paths, device)

    def one_path(path: KernelPath) -> list[WarmupResult]:
        return [_one(path, case, device) for p, case in planned if p is path]

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(itertools.chain.from_iterable(pool.map(one_path, paths)))


def warm_up_in_processes(
    cases: Sequence[Case],
    paths: Sequence[KernelPath],
    device: torch.device,
    processes: int,
    plugins: Sequence[str] = (),
    on_result: Callable[[WarmupResult], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[WarmupResult]:
    """Like :func:`warm_up`, each module build in one of ``processes`` spawned
    processes (``plugins``: imported there, so plugin paths resolve). Builds are in case
    order, so every path's first module starts early. ``on_result``: called with
    each build as it finishes (builds take minutes; the caller may report progress).
    ``stop``: polled while builds run; once true, builds not yet started are dropped and the
    finished ones are returned. A signal sent to the whole process group (as ``timeout`` and a
    terminal send it) also kills the build processes, and the pool then fails every build not
    finished: those are builds the interrupt stopped, not failed ones, so they are dropped too
    when ``stop`` turns true within :data:`INTERRUPT_GRACE_S` of the pool's breaking."""
    planned = builds(cases, paths, device)
    if not planned:
        return []

    def stopped(grace_s: float = 0.0) -> bool:
        """Whether the caller asked to stop, waiting up to ``grace_s`` for it to."""
        deadline = time.monotonic() + grace_s
        while True:
            if stop is not None and stop():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    context = multiprocessing.get_context("spawn")
    results: dict[int, WarmupResult] = {}
    died: dict[int, Future[WarmupResult]] = {}
    pool = ProcessPoolExecutor(
        max_workers=max(1, min(processes, len(planned))),
        mp_context=context,
        initializer=_process_init,
        initargs=(tuple(plugins),),
    )
    try:
        futures = {
            pool.submit(_process_build, path.name, case.to_json(), str(device)): n
            for n, (path, case) in enumerate(planned)
        }
        pending = set(futures)

        def record(n: int, future: Future[WarmupResult]) -> None:
            results[n] = _result_of(future, *planned[n])
            if on_result is not None:
                on_result(results[n])

        def take(done: set[Future[WarmupResult]]) -> None:
            for future in done:
                n = futures[future]
                if isinstance(future.exception(), BrokenProcessPool):
                    died[n] = future  # a failure, unless an interrupt killed it (below)
                else:
                    record(n, future)

        while pending and not stopped():
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            take(done)
        if pending:  # interrupted: a signal to the process group kills the builds too, and
            # their pool says so within moments (a build the signal spared goes on running)
            done, pending = wait(pending, timeout=INTERRUPT_GRACE_S, return_when=ALL_COMPLETED)
            take(done)
        if died and not stopped(grace_s=INTERRUPT_GRACE_S):
            for n in sorted(died):
                record(n, died[n])
    finally:
        # an interrupt: builds not started are dropped, running ones are left to end; a pool
        # whose processes died is waited for (its manager thread ends at once): left to end
        # while the command exits, Python 3.11's exit hook may write to the wake-up pipe that
        # thread closes, and print a traceback of OSError EBADF
        pool.shutdown(wait=bool(died), cancel_futures=True)
    return [results[n] for n in sorted(results)]


INTERRUPT_GRACE_S = 2.0
"""How long an interrupted warmup waits for its pool to tell whether the signal killed the
build processes too, and a warmup whose build processes died waits for its interrupt to be
seen before it reports them as failed builds (the signal reaches the parent with its
children; its handler runs at once, the pool's breaking is seen after the children have
exited)."""


def _result_of(future: Future[WarmupResult], path: KernelPath, case: Case) -> WarmupResult:
    """A finished build's result; a build whose process died (a signal, out of memory) is a
    failed build of its variant, not the command's end."""
    try:
        return future.result()
    except BrokenProcessPool:
        error = "its build process died (killed by a signal, or out of memory)"
    except Exception as exc:  # the child's own failure to start or to report
        error = f"{type(exc).__name__}: {exc}"
    return WarmupResult(path=path.name, variant=describe(case), seconds=0.0, error=error)


def _process_init(plugins: tuple[str, ...]) -> None:
    from difftest.paths import load_plugin

    for spec in plugins:
        load_plugin(spec)


def _process_build(name: str, case_json: dict[str, object], device: str) -> WarmupResult:
    from difftest.paths import get_path

    return _one(get_path(name), Case.from_json(case_json), torch.device(device))
