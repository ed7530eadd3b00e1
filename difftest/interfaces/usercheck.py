"""A one-call differential check for users' own kernels, for tests written with Hypothesis.

::

    from hypothesis import given
    from difftest.generation.strategies import cases
    import difftest

    @given(cases(preset="llama-3.1-8b"))
    def test_my_kernel(case):
        difftest.check(case, my_kernel)  # my_kernel(batch) -> Tensor[rows, H_q, D]

:func:`check` runs the kernel (or registered paths) on the case and the float64 oracle, judges
each request against the noise-floor tolerance, and raises :class:`CheckFailed` (an
``AssertionError``, so Hypothesis shrinks the case) with one line per finding. See
``docs/writing-tests.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from difftest.execution.evaluate import evaluate
from difftest.judgement.tolerance import Tolerance
from difftest.machine.environment import stamp
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Finding, Outcome, PathResult
from difftest.paths.registry import KernelPath, RunFn, get_path, resolve
from difftest.records.repro import Repro, write_repro

PathSpec = RunFn | KernelPath | str | Sequence[str | KernelPath | RunFn] | None


class CheckFailed(AssertionError):
    """A path disagreed with the oracle (or raised, crashed...): one line per finding."""

    def __init__(self, result: CaseResult, lines: list[str]) -> None:
        self.result = result
        super().__init__("\n".join(lines))


def check(
    case_or_batch: Case | Batch,
    paths: PathSpec = None,
    *,
    device: torch.device | str | None = None,
    tolerance: Tolerance | None = None,
    check_determinism: bool = False,
    repro_dir: Path | str | None = None,
    plugins: Sequence[str] = (),
    allow_unsupported: bool = False,
) -> CaseResult:
    """Run ``case_or_batch`` through ``paths`` and the oracle; raise on any finding.

    Parameters
    ----------
    case_or_batch
        A :class:`Case`, or a materialised :class:`Batch` (its case is rerun on its device:
        materialisation is deterministic, so the kernel sees the same bits).
    paths
        A kernel function ``run(batch) -> Tensor[num_query_rows, H_q, D]`` (checked under the
        name ``user-<function name>``), a :class:`KernelPath`, a registered path name, a list
        of these, or ``None`` for every registered path.
    device
        Where to run; default: the batch's device, else cuda when present, else cpu.
    repro_dir
        When given, each finding is also written there as a repro file (named by content hash,
        written atomically) and the failure names the file.
    allow_unsupported
        When every path declines the case, return instead of failing. Inside a Hypothesis test
        such a case is rejected (``hypothesis.reject``) so the strategy's health check counts it.

    Returns
    -------
    CaseResult
        Every path's verdict, when there is no finding.

    Raises
    ------
    CheckFailed
        On any finding, or when no path ran the case (see ``allow_unsupported``).
    """
    case = case_or_batch.case if isinstance(case_or_batch, Batch) else case_or_batch
    if device is None:
        if isinstance(case_or_batch, Batch):
            device = case_or_batch.device
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    chosen = as_paths(paths)
    tol = tolerance or Tolerance()
    result = evaluate(case, chosen, dev, tolerance=tol, check_determinism=check_determinism)
    findings = result.findings()
    if not findings:
        ran = [r for r in result.results if r.outcome is not Outcome.UNSUPPORTED]
        if ran or allow_unsupported:
            return result
        _reject_in_hypothesis()
        reasons = "; ".join(f"{r.path}: {r.reason}" for r in result.results)
        raise CheckFailed(result, [f"difftest: no path ran case {case.digest()} ({reasons})"])
    lines = [f"difftest: {len(findings)} finding(s) on case {case.digest()}"]
    for finding in findings:
        lines.append(f"{finding.path} {finding.outcome.value}: {finding.reason}")
        if repro_dir is not None:
            file = _write(Path(repro_dir), case, chosen, result, finding, tol, dev, plugins)
            lines.append(f"    repro: {file}")
    if repro_dir is not None and any(p.name.startswith("user-") for p in chosen):
        lines.append("    (register the kernel with difftest.register_path to replay it by name)")
    raise CheckFailed(result, lines)


def as_paths(paths: PathSpec) -> list[KernelPath]:
    """``paths`` (see :func:`check`) as a list of :class:`KernelPath`."""
    if paths is None:
        return resolve(None)
    if isinstance(paths, KernelPath | str) or callable(paths):
        items: list[object] = [paths]
    else:
        items = list(paths)
    out = []
    for item in items:
        if isinstance(item, KernelPath):
            out.append(item)
        elif isinstance(item, str):
            out.append(get_path(item))
        elif callable(item):
            name = getattr(item, "__name__", type(item).__name__)
            out.append(KernelPath(name=f"user-{name}", run=item, side="custom"))
        else:
            raise TypeError(f"not a path, a path name or a kernel function: {item!r}")
    return out


def _reject_in_hypothesis() -> None:
    try:
        from hypothesis import currently_in_test_context, reject
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        return
    if currently_in_test_context():
        reject()


def _write(
    directory: Path,
    case: Case,
    paths: list[KernelPath],
    result: CaseResult,
    finding: PathResult,
    tolerance: Tolerance,
    device: torch.device,
    plugins: Sequence[str],
) -> Path:
    repro = Repro(
        case=case,
        status="finding",
        paths=tuple(p.name for p in paths),
        finding=Finding(path=finding.path, kind=finding.outcome, reason=finding.reason),
        result=result,
        tolerance=tolerance,
        environment=stamp(device),
        plugins=tuple(plugins),
    )
    return write_repro(directory, repro)
