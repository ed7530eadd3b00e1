"""Repro files: one self-contained, human-readable JSON file per finding.

The first key is ``"format": "difftest-repro/1"`` and is checked before anything else. A repro
describes its case semantically (the spec and seed regenerate every tensor), so it replays on
any machine and library version; loading one never executes anything from it. A *pending*
repro (``status: "running"``) is written before a case runs, so a crash or a killed process
leaves the case on disk.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from difftest.atomic import write_json
from difftest.case import Case
from difftest.errors import FormatError
from difftest.outcome import Outcome

REPRO_FORMAT = "difftest-repro/1"
Status = Literal["finding", "running"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """What went wrong: the path, the kind of failure and its one-line reason."""

    path: str
    kind: Outcome
    reason: str = ""
    against: str = "oracle"
    """What the path disagrees with (the oracle, or another path)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind.value,
            "reason": self.reason,
            "against": self.against,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Repro:
    case: Case
    status: Status
    paths: tuple[str, ...]
    finding: Finding | None = None
    result: dict[str, Any] | None = None
    tolerance: dict[str, Any] | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    shrink: dict[str, Any] | None = None
    plugins: tuple[str, ...] = ()
    created: str = ""

    def file_name(self) -> str:
        if self.finding is None:
            return f"{self.case.digest()}.running.json"
        return f"{self.case.digest()}-{self.finding.path}-{self.finding.kind.value.lower()}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPRO_FORMAT,
            "status": self.status,
            "finding": self.finding.to_json() if self.finding else None,
            "paths": list(self.paths),
            "plugins": list(self.plugins),
            "case": self.case.to_json(),
            "result": self.result,
            "tolerance": self.tolerance,
            "shrink": self.shrink,
            "environment": self.environment,
            "created": self.created or _now(),
        }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_repro(directory: Path, repro: Repro) -> Path:
    """Write ``repro`` atomically into ``directory``; returns the file."""
    return write_json(directory / repro.file_name(), repro.to_json())


def parse_repro(data: Any, source: str) -> Repro:
    """A :class:`Repro` from parsed JSON; any defect is a :class:`FormatError` naming it."""
    if not isinstance(data, dict):
        raise FormatError(source, "not a difftest repro (expected a JSON object)")
    fmt = data.get("format")
    if fmt != REPRO_FORMAT:
        raise FormatError(source, f"unknown repro format {fmt!r}, expected {REPRO_FORMAT!r}")
    status = data.get("status")
    if status not in ("finding", "running"):
        raise FormatError(source, f"status must be 'finding' or 'running', got {status!r}")
    paths = data.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise FormatError(source, "paths must be a list of path names")
    plugins = data.get("plugins", [])
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise FormatError(source, "plugins must be a list of module names")
    finding = None
    raw = data.get("finding")
    if raw is not None:
        try:
            finding = Finding(
                path=str(raw["path"]),
                kind=Outcome(raw["kind"]),
                reason=str(raw.get("reason", "")),
                against=str(raw.get("against", "oracle")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(source, f"malformed finding: {e}") from None
    elif status == "finding":
        raise FormatError(source, "status is 'finding' but there is no finding")
    for key in ("result", "tolerance", "shrink", "environment"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise FormatError(source, f"{key} must be an object")
    return Repro(
        case=Case.from_json(data.get("case"), source=source),
        status=status,
        paths=tuple(paths),
        finding=finding,
        result=data.get("result"),
        tolerance=data.get("tolerance"),
        environment=data.get("environment") or {},
        shrink=data.get("shrink"),
        plugins=tuple(plugins),
        created=str(data.get("created", "")),
    )


def load_repro(path: Path | str) -> Repro:
    """Read and validate a repro file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(str(p), "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FormatError(str(p), f"cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(str(p), f"not valid JSON (truncated?): {e.msg} at line {e.lineno}") from None
    return parse_repro(data, str(p))
