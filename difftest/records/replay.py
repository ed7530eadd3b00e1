"""Replay: regenerate a repro's case from its spec, rerun it, and compare signatures.

Per path replayed, one verdict: *still fails* (the same signature; for the finding's own path,
with a note when the metrics are identical bit for bit), *fixed* (the path now agrees), *fails
differently* (another failure, named), or *not available here* (with the path's reason). A
pending repro (``status: running``, written before a case that may have crashed) has no
signature to compare: its paths either *fail* or *pass*.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from difftest.execution.executors import Executor, InProcessExecutor
from difftest.judgement.signature import Signature, signature_of
from difftest.judgement.tolerance import Tolerance
from difftest.model.errors import FormatError, PluginError, UnknownPath
from difftest.model.outcome import Outcome, PathResult
from difftest.paths.registry import KernelPath, all_paths, get_path, load_plugin
from difftest.records.repro import Repro

ExecutorFactory = Callable[[Sequence[KernelPath], torch.device, Tolerance], Executor]


class Verdict(str, enum.Enum):
    STILL_FAILS = "still fails"
    FIXED = "fixed"
    FAILS_DIFFERENTLY = "fails differently"
    UNAVAILABLE = "not available"
    FAILS = "fails"
    """A pending repro (no recorded finding) fails on this path."""
    PASSES = "passes"
    """A pending repro agrees on this path."""

    @property
    def failing(self) -> bool:
        return self in (Verdict.STILL_FAILS, Verdict.FAILS_DIFFERENTLY, Verdict.FAILS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOutcome:
    """The verdict of one path on one replayed repro."""

    source: str
    path: str
    verdict: Verdict
    detail: str = ""
    expected: Signature | None = None
    observed: Signature | None = None
    result: PathResult | None = None
    same_metrics: bool | None = None
    """For the finding's own path: the rerun's metrics equal the recorded ones exactly."""

    def line(self) -> str:
        if self.verdict is Verdict.UNAVAILABLE:
            return f"{self.source}: path {self.path} not available here: {self.detail}"
        text = f"{self.source}: {self.verdict.value}: {self.path}"
        if self.detail:
            text += f": {self.detail}"
        if self.same_metrics:
            text += " [metrics identical bit for bit]"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.source,
            "path": self.path,
            "verdict": self.verdict.name.lower(),
            "detail": self.detail,
            "expected": self.expected.to_json() if self.expected else None,
            "observed": self.observed.to_json() if self.observed else None,
            "result": self.result.to_json() if self.result else None,
            "same_metrics": self.same_metrics,
        }


def resolve_plugin(spec: str, repro_file: Path | None) -> str:
    """A recorded ``.py`` plugin path that does not exist relative to the working directory
    is looked up relative to the repro's folder and each folder above it."""
    if not (spec.endswith(".py") or "/" in spec) or Path(spec).is_absolute() or Path(spec).exists():
        return spec
    if repro_file is not None:
        for folder in Path(repro_file).resolve().parents:
            if (folder / spec).is_file():
                return str(folder / spec)
    return spec


def load_recorded_plugins(
    repro: Repro, needed: Sequence[str], repro_file: Path | None, extra: Sequence[str] = ()
) -> list[str]:
    """Import the repro's recorded plugins (and ``extra``) when a needed path is missing.

    A path already registered in this process wins (so a test can swap in a fixed kernel).
    Returns the one-line problems of plugins that failed to import.
    """
    registered = {p.name for p in all_paths()}
    if all(name in registered for name in needed):
        return []
    problems = []
    for spec in dict.fromkeys([*repro.plugins, *extra]):
        try:
            load_plugin(resolve_plugin(spec, repro_file))
        except PluginError as e:
            problems.append(str(e))
    return problems


def resolve_paths(names: Sequence[str], source: str, problems: Sequence[str]) -> list[KernelPath]:
    try:
        return [get_path(n) for n in names]
    except UnknownPath as e:
        hint = f" ({'; '.join(problems)})" if problems else ""
        raise FormatError(source, f"{e}{hint}") from None


def replay_repro(
    repro: Repro,
    device: torch.device,
    *,
    source: str = "repro",
    paths: Sequence[str] | None = None,
    repro_file: Path | None = None,
    plugins: Sequence[str] = (),
    make_executor: ExecutorFactory | None = None,
) -> list[ReplayOutcome]:
    """Rerun ``repro`` on ``device`` through its finding's path (or ``paths``)."""
    expected = repro.signature()
    if paths:
        names = list(paths)
    elif expected is not None:
        names = [expected.path]
    else:
        names = list(repro.paths)
    problems = load_recorded_plugins(repro, names, repro_file, plugins)
    chosen = resolve_paths(names, source, problems)
    outcomes: dict[str, ReplayOutcome] = {}
    runnable = []
    for path in chosen:
        reason = path.support(repro.case, device)
        if reason is None:
            runnable.append(path)
        else:
            outcomes[path.name] = ReplayOutcome(
                source=source, path=path.name, verdict=Verdict.UNAVAILABLE, detail=reason
            )
    if runnable:
        tolerance = Tolerance()
        factory = make_executor or InProcessExecutor
        executor = factory(runnable, device, tolerance)
        try:
            determinism = expected is not None and expected.kind is Outcome.NONDETERMINISTIC
            if repro.launch:  # a finding that shows only when packed: replay the launch
                results = executor.evaluate_pack(repro.launch, check_determinism=determinism)
                result = results[repro.launch.index(repro.case)]
            else:
                result = executor.evaluate(repro.case, check_determinism=determinism)
        finally:
            executor.close()
        for path in runnable:
            got = result.result_for(path.name)
            assert got is not None, f"no result for {path.name}"
            outcomes[path.name] = judge_replay(repro, got, source)
    return [outcomes[p.name] for p in chosen]


def judge_replay(repro: Repro, got: PathResult, source: str) -> ReplayOutcome:
    """Compare one path's rerun verdict with the repro's signature."""
    expected = repro.signature()
    observed = signature_of(got)

    def verdict(kind: Verdict, detail: str, identical: bool | None = None) -> ReplayOutcome:
        return ReplayOutcome(
            source=source,
            path=got.path,
            verdict=kind,
            detail=detail,
            expected=expected,
            observed=observed,
            result=got,
            same_metrics=identical,
        )

    if got.outcome is Outcome.UNSUPPORTED:
        return verdict(Verdict.UNAVAILABLE, got.reason)
    if expected is None:
        if got.outcome.is_finding:
            return verdict(Verdict.FAILS, f"{observed.outcome_text()}: {got.reason}")
        return verdict(Verdict.PASSES, "agrees")
    own = got.path == expected.path
    if expected.matches(observed) if own else expected.same_failure(observed):
        recorded = repro.path_result(got.path) if own else None
        identical = recorded.metrics.same_as(got.metrics) if recorded else None
        return verdict(Verdict.STILL_FAILS, f"{observed.outcome_text()}: {got.reason}", identical)
    if got.outcome is Outcome.AGREE:
        return verdict(Verdict.FIXED, f"agrees (was {expected.kind.value})")
    return verdict(
        Verdict.FAILS_DIFFERENTLY,
        f"now {observed.outcome_text()}: {got.reason} (was {expected.describe()})",
    )
