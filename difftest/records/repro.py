"""Repro files: one self-contained, human-readable JSON file per finding.

The first key is ``"format": "difftest-repro/1"`` and is checked before anything else. A repro
describes its case semantically (the spec and seed regenerate every tensor), so it replays on
any machine and library version; loading one never executes anything from it. A *pending*
repro (``status: "running"``) is written before a case runs, so a crash or a killed process
leaves the case on disk.

Besides what the writer gives, every finding's file carries two derived blocks: ``signature``
(what replay and shrinking compare) and ``location`` (per wrong request: query rows, heads,
the pages holding its KV and the pages its wrong rows can see). Tensors are embedded only when
a case cannot be regenerated from its spec (a plugin's private inputs, a kernel output kept
for ``explain`` on a machine without the path): as a safetensors sidecar ``<name>.safetensors``
next to the repro, named by ``tensors.file`` and checked against its SHA-256, never pickle.
The JSON Schema is ``difftest/schemas/repro.schema.json``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from difftest.judgement.signature import Signature, signature_of
from difftest.model.case import Case
from difftest.model.errors import FormatError
from difftest.model.outcome import Finding, Outcome, PathResult
from difftest.records.atomic import write_bytes, write_json
from difftest.triage.location import locate_pages

REPRO_FORMAT = "difftest-repro/1"
Status = Literal["finding", "running"]
SIDECAR_SUFFIX = ".safetensors"


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorRef:
    """A safetensors sidecar: its file name (next to the repro), keys and SHA-256."""

    file: str
    keys: tuple[str, ...]
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "keys": list(self.keys), "sha256": self.sha256}


@dataclass(frozen=True, slots=True, kw_only=True)
class Repro:
    """One repro file: the case, what was found on it (``None`` while it is pending), every
    path's recorded verdict (``result``), the tolerance, the shrink report, the environment
    and the plugins that registered its paths."""

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
    tensors: TensorRef | None = None
    launch: tuple[Case, ...] = ()
    """A finding that shows only in a packed launch: the launch's cases, ``case`` among
    them (replay runs them together); empty for a finding of the case alone."""

    def file_name(self) -> str:
        if self.finding is None:
            return f"{self.case.digest()}.running.json"
        return f"{self.case.digest()}-{self.finding.path}-{self.finding.kind.value.lower()}.json"

    def path_result(self, path: str | None = None) -> PathResult | None:
        """The recorded verdict of ``path`` (default: the finding's path), if any."""
        name = path or (self.finding.path if self.finding else None)
        if name is None or not self.result:
            return None
        for raw in self.result.get("results", []):
            if isinstance(raw, dict) and raw.get("path") == name:
                try:
                    return PathResult.from_json(raw)
                except (KeyError, TypeError, ValueError):
                    return None
        return None

    def signature(self) -> Signature | None:
        """The failure replay and shrinking compare against (``None`` for a pending repro)."""
        if self.finding is None:
            return None
        recorded = self.path_result()
        if recorded is not None and recorded.outcome is self.finding.kind:
            return signature_of(recorded, self.finding.against)
        return Signature(
            path=self.finding.path, kind=self.finding.kind, against=self.finding.against
        )

    def location(self) -> list[dict[str, Any]] | None:
        """Per wrong request: rows, heads, error, and the pages involved (derived)."""
        recorded = self.path_result()
        if recorded is None or not recorded.metrics.get("errors"):
            return None
        return locate_pages(self.case, recorded.metrics["errors"])

    def to_json(self) -> dict[str, Any]:
        signature = self.signature()
        return {
            "format": REPRO_FORMAT,
            "status": self.status,
            "finding": self.finding.to_json() if self.finding else None,
            "signature": signature.to_json() if signature else None,
            "paths": list(self.paths),
            "plugins": list(self.plugins),
            "case": self.case.to_json(),
            "launch": [c.to_json() for c in self.launch] or None,
            "result": self.result,
            "tolerance": self.tolerance,
            "location": self.location(),
            "shrink": self.shrink,
            "tensors": self.tensors.to_json() if self.tensors else None,
            "environment": self.environment,
            "created": self.created or _now(),
        }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_repro(
    directory: Path,
    repro: Repro,
    tensors: Mapping[str, torch.Tensor] | None = None,
    *,
    file_name: str | None = None,
) -> Path:
    """Write ``repro`` atomically into ``directory``; returns the file.

    ``tensors``: embed these (a safetensors sidecar named after the repro, written first, so a
    repro never names a sidecar that is not there). ``file_name``: instead of the canonical
    ``<digest>-<path>-<kind>.json`` (to rewrite a renamed repro in place).
    """
    name = file_name or repro.file_name()
    if tensors:
        from safetensors.torch import save

        stem = name.removesuffix(".json")
        data = save({k: t.detach().cpu().contiguous() for k, t in tensors.items()})
        write_bytes(directory / f"{stem}{SIDECAR_SUFFIX}", data)
        ref = TensorRef(
            file=f"{stem}{SIDECAR_SUFFIX}",
            keys=tuple(sorted(tensors)),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        repro = Repro(**{**_fields(repro), "tensors": ref})
    return write_json(directory / name, repro.to_json())


def _fields(repro: Repro) -> dict[str, Any]:
    return {name: getattr(repro, name) for name in repro.__dataclass_fields__}


def load_tensors(repro: Repro, repro_file: Path | str) -> dict[str, torch.Tensor]:
    """The sidecar tensors of ``repro`` (read from next to ``repro_file``); ``{}`` if none.

    safetensors holds raw bytes and a JSON header: loading executes nothing.
    """
    if repro.tensors is None:
        return {}
    from safetensors.torch import load

    sidecar = Path(repro_file).parent / repro.tensors.file
    try:
        data = sidecar.read_bytes()
    except OSError as e:
        raise FormatError(str(sidecar), f"cannot read the tensor sidecar: {e}") from None
    if hashlib.sha256(data).hexdigest() != repro.tensors.sha256:
        raise FormatError(str(sidecar), "tensor sidecar does not match its recorded sha256")
    try:
        return dict(load(data))
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise FormatError(str(sidecar), f"not a valid safetensors file: {e}") from None


def _tensor_ref(raw: Any, source: str) -> TensorRef | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise FormatError(source, "tensors must be an object")
    name, keys, sha = raw.get("file"), raw.get("keys"), raw.get("sha256")
    if (
        not isinstance(name, str)
        or not name.endswith(SIDECAR_SUFFIX)
        or Path(name).name != name
        or name.startswith(".")
    ):
        raise FormatError(source, f"tensors.file must be a plain *.safetensors name, got {name!r}")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise FormatError(source, "tensors.keys must be a list of names")
    if not isinstance(sha, str) or len(sha) != 64:
        raise FormatError(source, "tensors.sha256 must be a hex SHA-256")
    return TensorRef(file=name, keys=tuple(keys), sha256=sha)


def parse_repro(data: Any, source: str) -> Repro:
    """A :class:`Repro` from parsed JSON; any defect is a :class:`FormatError` naming it.

    Derived blocks (``signature``, ``location``) are recomputed, not read.
    """
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
    result = data.get("result")
    if result is not None and not isinstance(result.get("results", []), list):
        raise FormatError(source, "result.results must be a list")
    case = Case.from_json(data.get("case"), source=source)
    return Repro(
        case=case,
        status=status,
        paths=tuple(paths),
        finding=finding,
        result=result,
        tolerance=data.get("tolerance"),
        environment=data.get("environment") or {},
        shrink=data.get("shrink"),
        plugins=tuple(plugins),
        created=str(data.get("created", "")),
        tensors=_tensor_ref(data.get("tensors"), source),
        launch=_launch(data.get("launch"), case, source),
    )


def _launch(raw: Any, case: Case, source: str) -> tuple[Case, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) < 2:
        raise FormatError(source, "launch must be null or a list of at least two cases")
    cases = tuple(Case.from_json(c, source=f"{source} launch[{i}]") for i, c in enumerate(raw))
    if case not in cases:
        raise FormatError(source, "launch does not contain the repro's case")
    from difftest.execution.packing import packable

    reason = packable(cases)
    if reason is not None:
        raise FormatError(source, f"launch cases cannot share a launch: {reason}")
    return cases


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
        raise FormatError(
            str(p), f"not valid JSON (truncated?): {e.msg} at line {e.lineno}"
        ) from None
    return parse_repro(data, str(p))
