"""Replay: regenerate a repro's case from its spec, rerun it, and compare signatures.

Per path replayed, one verdict: *still fails* (the same signature as before; with a note when
the metrics are identical bit for bit), *fixed* (a path that failed before agrees now), *fails
differently* (another failure, named), *agrees* (a path that did not fail before agrees: not
"fixed"), *fails* (a path that did not fail before fails now), or *not available here* (with
the path's reason). A pending repro (``status: running``, written before a case that may have
crashed) has no signature to compare: its paths either *fail* or *pass*.

Verdicts are judged by the tool's tolerance, never the file's (a file is untrusted: an edited
tolerance must not turn a failure into "fixed"); ``difftest replay --file-tolerance`` asks
for the recorded one explicitly. The repro's plugins are never imported: a path the command
line did not register is an error naming the plugin to pass.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difftest.execution.session import Session
from difftest.judgement.signature import Signature, signature_of
from difftest.model.errors import PluginError
from difftest.model.outcome import Outcome, PathResult
from difftest.paths.registry import all_paths, get_path
from difftest.records.repro import Repro
from difftest.records.untrusted import check_fits


class Verdict(str, enum.Enum):
    STILL_FAILS = "still fails"
    FIXED = "fixed"
    FAILS_DIFFERENTLY = "fails differently"
    UNAVAILABLE = "not available"
    FAILS = "fails"
    """A pending repro (no recorded finding) fails on this path."""
    PASSES = "passes"
    """A pending repro agrees on this path."""
    AGREES = "agrees"
    """A path that did not fail on this repro before agrees now (never "fixed")."""

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


def missing_paths(names: Sequence[str], repro: Repro, given: Sequence[str]) -> None:
    """Refuse a replay whose paths are not registered: name them, and the recorded plugins
    that would register them which were not given on the command line (a repro's plugins
    are data: they are never imported from the file)."""
    registered = {p.name for p in all_paths()}
    missing = [n for n in names if n not in registered]
    if not missing:
        return
    wanted = [spec for spec in repro.plugins if not plugin_given(spec, given)]
    hint = (
        f"; the repro was written with plugin(s) {', '.join(wanted)}: pass "
        + " ".join(f"--plugin {spec}" for spec in wanted)
        if wanted
        else ""
    )
    raise PluginError(f"path(s) {', '.join(missing)} not registered here{hint}")


def plugin_given(spec: str, given: Sequence[str]) -> bool:
    """Whether the recorded plugin ``spec`` is among the command line's (a ``.py`` file by
    its file name, a module by its name)."""
    if spec.endswith(".py") or "/" in spec:
        return any(Path(g).name == Path(spec).name for g in given)
    return spec in given


def replay_repro(
    repro: Repro,
    session: Session,
    *,
    source: str = "repro",
    paths: Sequence[str] | None = None,
) -> list[ReplayOutcome]:
    """Rerun ``repro`` through its finding's path (or ``paths``), in ``session``'s executor
    (isolated by default: a CRASH or HANG repro is reported, never takes the command down),
    judged by the session's tolerance. A case (or launch) over the memory the device has free
    is refused before anything is allocated (:func:`~difftest.records.untrusted.check_fits`)."""
    expected = repro.signature()
    if paths:
        names = list(paths)
    elif expected is not None:
        names = [expected.path]
    else:
        names = list(repro.paths)
    missing_paths(names, repro, session.settings.plugins)
    chosen = [get_path(n) for n in names]
    outcomes: dict[str, ReplayOutcome] = {}
    runnable = []
    for path in chosen:
        reason = path.support(repro.case, session.device)
        if reason is None:
            runnable.append(path)
        else:
            outcomes[path.name] = ReplayOutcome(
                source=source, path=path.name, verdict=Verdict.UNAVAILABLE, detail=reason
            )
    if runnable:
        check_fits(repro.case, session.device, source, launch=repro.launch)
        executor = session.executor(runnable)
        determinism = expected is not None and expected.kind is Outcome.NONDETERMINISTIC
        if repro.launch:  # a finding that shows only when packed: replay the launch
            results = executor.evaluate_pack(repro.launch, check_determinism=determinism)
            result = results[repro.launch.index(repro.case)]
        else:
            result = executor.evaluate(repro.case, check_determinism=determinism)
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
    recorded = repro.path_result(got.path)
    before = expected if own else (signature_of(recorded) if recorded else None)
    if before is None or not before.kind.is_finding:
        # A path that did not fail on this repro before: never "fixed".
        if not got.outcome.is_finding:
            said = "as recorded" if recorded is not None else "not run before"
            return verdict(Verdict.AGREES, f"agrees ({said})")
        return verdict(
            Verdict.FAILS, f"{observed.outcome_text()}: {got.reason} (not a failure before)"
        )
    if before.matches(observed):
        identical = recorded.metrics.same_as(got.metrics) if recorded else None
        return verdict(Verdict.STILL_FAILS, f"{observed.outcome_text()}: {got.reason}", identical)
    if not got.outcome.is_finding:  # AGREE, or IGNORES an argument it does not apply
        return verdict(Verdict.FIXED, f"agrees (was {before.kind.value})")
    return verdict(
        Verdict.FAILS_DIFFERENTLY,
        f"now {observed.outcome_text()}: {got.reason} (was {before.describe()})",
    )
