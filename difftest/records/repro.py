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

import dataclasses
import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from difftest.execution.packing import packable
from difftest.judgement.signature import Signature, signature_of
from difftest.judgement.tolerance import Tolerance
from difftest.machine.environment import Environment
from difftest.model.case import Case
from difftest.model.errors import FormatError, shown
from difftest.model.outcome import CaseResult, Finding, Outcome, PathResult
from difftest.model.strict_json import Reader
from difftest.records.atomic import write_bytes, write_json
from difftest.records.untrusted import read_json
from difftest.reduction.report import ShrinkReport
from difftest.triage.location import PageLocation, check_inside, locate_pages

REPRO_FORMAT = "difftest-repro/1"
Status = Literal["finding", "running"]
SIDECAR_SUFFIX = ".safetensors"


def finding_stem(digest: str, path: str, kind: Outcome) -> str:
    """A finding's repro file name without its ending: ``<digest>-<path>-<outcome>``; a
    packed-only finding's file (its whole launch) adds :data:`PACKED_ENDING`."""
    return f"{digest}-{path}-{kind.value.lower()}"


PACKED_ENDING = "-packed.json"


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
    path's recorded verdict (``result``), the tolerance that decided it, the shrink report,
    the environment and the plugins that registered its paths."""

    case: Case
    status: Status
    paths: tuple[str, ...]
    finding: Finding | None = None
    result: CaseResult | None = None
    tolerance: Tolerance | None = None
    environment: Environment = field(default_factory=Environment)
    shrink: ShrinkReport | None = None
    plugins: tuple[str, ...] = ()
    """The plugins that registered the paths when it was written: data only. Loading a repro
    never imports them; a command that needs them takes them on its command line."""
    created: str = ""
    tensors: TensorRef | None = None
    launch: tuple[Case, ...] = ()
    """A finding that shows only in a packed launch: the launch's cases, ``case`` among
    them (replay runs them together); empty for a finding of the case alone."""

    def file_name(self) -> str:
        if self.finding is None:
            return f"{self.case.digest()}.running.json"
        return finding_stem(self.case.digest(), self.finding.path, self.finding.kind) + ".json"

    def path_result(self, path: str | None = None) -> PathResult | None:
        """The recorded verdict of ``path`` (default: the finding's path), if any."""
        name = path or (self.finding.path if self.finding else None)
        if name is None or self.result is None:
            return None
        return self.result.result_for(name)

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

    def location(self) -> list[PageLocation] | None:
        """Per wrong request: rows, heads, error, and the pages involved (derived)."""
        recorded = self.path_result()
        if recorded is None or not recorded.metrics.errors:
            return None
        return locate_pages(self.case, recorded.metrics.errors)

    def to_json(self) -> dict[str, Any]:
        signature = self.signature()
        location = self.location()
        return {
            "format": REPRO_FORMAT,
            "status": self.status,
            "finding": self.finding.to_json() if self.finding else None,
            "signature": signature.to_json() if signature else None,
            "paths": list(self.paths),
            "plugins": list(self.plugins),
            "case": self.case.to_json(),
            "launch": [c.to_json() for c in self.launch] or None,
            "result": self.result.to_json() if self.result else None,
            "tolerance": self.tolerance.to_json() if self.tolerance else None,
            "location": [x.to_json() for x in location] if location is not None else None,
            "shrink": self.shrink.to_json() if self.shrink else None,
            "tensors": self.tensors.to_json() if self.tensors else None,
            "environment": self.environment.to_json(),
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
        repro = dataclasses.replace(repro, tensors=ref)
    return write_json(directory / name, repro.to_json())


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


def _tensor_ref(r: Reader | None) -> TensorRef | None:
    if r is None:
        return None
    r.only("file", "keys", "sha256")
    name = r.text("file", required=True)
    if not name.endswith(SIDECAR_SUFFIX) or Path(name).name != name or name.startswith("."):
        raise r.fail("file", f"must be a plain *.safetensors name, got {shown(name)}")
    sha = r.text("sha256", required=True)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise r.fail("sha256", "must be a hex SHA-256")
    return TensorRef(file=name, keys=r.texts("keys", max_items=64), sha256=sha)


_KEYS = (
    "format status finding signature paths plugins case launch result tolerance location "
    "shrink tensors environment created"
).split()
MAX_LAUNCH_CASES = 64
"""Cases a packed launch in a repro may hold."""


def parse_repro(data: Any, source: str) -> Repro:
    """A :class:`Repro` from parsed JSON; any defect is a :class:`FormatError` naming it.

    Derived blocks (``signature``'s path and kind, ``location``) are recomputed, not read.
    """
    if not isinstance(data, dict):
        raise FormatError(source, "not a difftest repro (expected a JSON object)")
    fmt = data.get("format")
    if fmt != REPRO_FORMAT:
        raise FormatError(source, f"unknown repro format {shown(fmt)}, expected {REPRO_FORMAT!r}")
    r = Reader(data, source, "repro").only(*_KEYS)
    status = r.text("status", required=True)
    if status not in ("finding", "running"):
        raise r.fail("status", f"must be 'finding' or 'running', got {shown(status)}")
    raw_finding = r.obj("finding")
    finding = Finding.from_json(raw_finding) if raw_finding is not None else None
    if finding is None and status == "finding":
        raise FormatError(source, "status is 'finding' but there is no finding")
    case = Case.from_json(data.get("case"), source=source)
    raw_result = r.obj("result")
    raw_tolerance = r.obj("tolerance")
    raw_shrink = r.obj("shrink")
    raw_signature = r.obj("signature")
    recorded = Signature.from_json(raw_signature) if raw_signature is not None else None
    result = CaseResult.from_json(raw_result) if raw_result is not None else None
    if result is not None and finding is not None and recorded is not None:
        result = _with_legacy_detail(result, finding, recorded)
    for verdict in result.results if result is not None else ():
        outside = check_inside(case, verdict.metrics.errors)
        if outside is not None:
            raise FormatError(source, f"result of {verdict.path}: error located at {outside}")
    return Repro(
        case=case,
        status="finding" if status == "finding" else "running",
        paths=r.texts("paths", max_items=256),
        finding=finding,
        result=result,
        tolerance=Tolerance.from_json(raw_tolerance) if raw_tolerance is not None else None,
        environment=Environment.from_json(r.obj("environment")),
        shrink=ShrinkReport.from_json(raw_shrink) if raw_shrink is not None else None,
        plugins=r.texts("plugins", max_items=64),
        created=r.text("created"),
        tensors=_tensor_ref(r.obj("tensors")),
        launch=_launch(r, case),
    )


def _with_legacy_detail(result: CaseResult, finding: Finding, recorded: Signature) -> CaseResult:
    """Files written before verdicts carried ``detail`` keep it only in their signature block:
    give it back to the finding's own verdict (never derived from a reason's text)."""
    own = result.result_for(finding.path)
    if own is None or own.detail or own.outcome is not finding.kind or not recorded.detail:
        return result
    fixed = dataclasses.replace(own, detail=recorded.detail)
    return dataclasses.replace(
        result, results=tuple(fixed if r is own else r for r in result.results)
    )


def _launch(r: Reader, case: Case) -> tuple[Case, ...]:
    if not r.has("launch"):
        return ()
    raw = r.items("launch", max_items=MAX_LAUNCH_CASES)
    if len(raw) < 2:
        raise r.fail("launch", "must be null or a list of at least two cases")
    cases = tuple(Case.from_json(c, source=f"{r.source} launch[{i}]") for i, c in enumerate(raw))
    if case not in cases:
        raise r.fail("launch", "does not contain the repro's case")
    reason = packable(cases)
    if reason is not None:
        raise r.fail("launch", f"cases cannot share a launch: {reason}")
    return cases


def load_repro(path: Path | str) -> Repro:
    """Read, parse and validate a repro file, as untrusted input
    (:mod:`difftest.records.untrusted`): every case in it within the caps."""
    return parse_repro(read_json(path, what="repro file"), str(path))
