"""A campaign's output folder: a handful of files per group, every finding kept.

::

    OUT/
      findings.jsonl        every finding, one JSON line each, appended as it is found
      running.jsonl         write-ahead: each launch's cases before it runs, then "done"
      groups/<id>.repro.json   each group's representative repro (its minimal case once shrunk)
      groups.json           the groups as last written: trigger, count, digests, repro (what
                            ``difftest triage`` starts from)
      died/<digest>.running.json   cases a killed run left running (kept as pending repros)

``findings.jsonl`` holds each finding's case spec, verdict and group, so any finding replays by
its digest (``difftest replay OUT --digest D``) and the run can be regrouped later
(``difftest triage OUT``). Both logs are appended a line at a time, so a run killed with
``kill -9`` loses at most the line it was writing; the write-ahead log tells the next run
into the same folder which cases were running when the last one died.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difftest.model.case import Case
from difftest.model.errors import FormatError, SetupError
from difftest.model.outcome import PathResult
from difftest.model.strict_json import Reader
from difftest.records.atomic import append_line, write_text
from difftest.records.repro import Repro, write_repro
from difftest.triage.groups import GroupRecord

FINDINGS_LOG = "findings.jsonl"
WRITE_AHEAD = "running.jsonl"
GROUPS = "groups"
DIED = "died"
GROUP_INDEX = "groups.json"
LOG_FORMAT = "difftest-finding/1"
INDEX_FORMAT = "difftest-groups/1"


def check_output_dir(root: Path, flag: str = "--out") -> None:
    """Refuse, before anything runs, an output folder that cannot be written: a file is made
    and removed in it (or in its nearest existing parent, when it is still to be made; nothing
    is created there), since permission bits say nothing of a read-only file system, of
    ``/proc`` or ``/sys``, or of root."""
    if root.exists() and not root.is_dir():
        raise SetupError(f"{flag} {root}: exists and is not a folder")
    probe = root
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise SetupError(f"{flag} {root}: {probe} is not a folder")
    import os
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".difftest-probe-", dir=probe)
    except OSError as e:
        raise SetupError(f"{flag} {root}: {probe} is not writable ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def check_output_file(file: Path, flag: str) -> None:
    """Refuse, before anything runs, a report file that cannot be written (it is written
    through a temporary file in its folder, renamed over it)."""
    if file.exists() and file.is_dir():
        raise SetupError(f"{flag} {file}: exists and is a folder")
    if file.exists() and not file.is_file():
        raise SetupError(f"{flag} {file}: exists and is not a regular file")
    import os

    if file.exists() and not os.access(file, os.W_OK):
        raise SetupError(f"{flag} {file}: exists and is read-only")
    check_output_dir(file.parent, flag)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedFinding:
    """One line of ``findings.jsonl``."""

    index: int
    """The case's campaign index."""
    case: Case
    result: PathResult
    group: str
    """The id of the group it was put in when it was found (``-unsorted`` while waiting)."""
    other_paths: tuple[str, ...] = ()
    launch: tuple[Case, ...] = ()
    """For a finding only a packed launch shows: the launch's cases."""

    @property
    def digest(self) -> str:
        return self.case.digest()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": LOG_FORMAT,
            "index": self.index,
            "digest": self.digest,
            "group": self.group,
            "result": self.result.to_json(),
            "other_paths": list(self.other_paths),
            "case": self.case.to_json(),
            "launch": [c.to_json() for c in self.launch] or None,
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> LoggedFinding:
        r = Reader(data, source, "finding").only(
            "format", "index", "digest", "group", "result", "other_paths", "case", "launch"
        )
        if r.text("format") != LOG_FORMAT:
            raise r.fail("format", f"expected {LOG_FORMAT!r}")
        result = r.obj("result", required=True)
        assert result is not None
        launch = tuple(
            Case.from_json(c, source=f"{source} launch[{i}]")
            for i, c in enumerate(r.items("launch", max_items=64))
        )
        return cls(
            index=r.integer("index", 0, minimum=0) or 0,
            case=Case.from_json(data.get("case"), source=source),
            result=PathResult.from_json(result),
            group=r.text("group"),
            other_paths=r.texts("other_paths", max_items=64),
            launch=launch,
        )


class RunDirectory:
    """The files of one campaign output folder (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._launch = 0

    @property
    def findings_log(self) -> Path:
        return self.root / FINDINGS_LOG

    @property
    def write_ahead(self) -> Path:
        return self.root / WRITE_AHEAD

    def open(self) -> list[Case]:
        """Create the folder, and keep what a killed earlier run left running: each such
        case is written under ``died/`` as a pending repro (replayable) and returned."""
        check_output_dir(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        died = self._left_running()
        for case in died:
            write_repro(self.root / DIED, Repro(case=case, status="running", paths=()))
        write_text(self.write_ahead, "", durable=False)
        return died

    def _left_running(self) -> list[Case]:
        if not self.write_ahead.is_file():
            return []
        started: dict[int, list[Any]] = {}
        for line in self.write_ahead.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the torn last line of a killed writer
            if not isinstance(entry, dict) or not isinstance(entry.get("launch"), int):
                continue
            if "cases" in entry and isinstance(entry["cases"], list):
                started[entry["launch"]] = entry["cases"]
            else:
                started.pop(entry["launch"], None)
        cases: list[Case] = []
        for raw in started.values():
            for data in raw:
                try:
                    cases.append(Case.from_json(data, source=str(self.write_ahead)))
                except FormatError:
                    continue
        return cases

    def begin(self, cases: Sequence[Case]) -> int:
        """Note a launch's cases before it runs; returns its number for :meth:`end`."""
        self._launch += 1
        # each case's JSON text as the case keeps it (it is sent to the worker too)
        texts = ",".join(c.canonical_json() for c in cases)
        append_line(self.write_ahead, f'{{"launch":{self._launch},"cases":[{texts}]}}')
        return self._launch

    def end(self, launch: int, status: str = "done") -> None:
        """The launch finished (``done``) or was cut by the budget (``cut``): not a death."""
        append_line(self.write_ahead, json.dumps({"launch": launch, "status": status}))

    def log(self, finding: LoggedFinding) -> None:
        append_line(
            self.findings_log,
            json.dumps(finding.to_json(), separators=(",", ":"), allow_nan=True),
        )

    def write_group(self, group_id: str, repro: Repro) -> Path:
        return write_repro(self.root / GROUPS, repro, file_name=f"{group_id}.repro.json")

    def write_index(self, cases: int, groups: Sequence[GroupRecord]) -> None:
        """(Re)write ``groups.json``: the run's groups with their triggers, as of now."""
        data = {
            "format": INDEX_FORMAT,
            "cases": cases,
            "groups": [g.to_json() for g in groups],
        }
        write_text(self.root / GROUP_INDEX, json.dumps(data, indent=1) + "\n", durable=False)

    def index(self) -> tuple[int, list[GroupRecord]]:
        """``groups.json`` read back: the number of cases the run ran and its groups
        (``(0, [])`` when the run wrote none, e.g. one killed before its first group)."""
        file = self.root / GROUP_INDEX
        if not file.is_file():
            return 0, []
        from difftest.records.untrusted import read_json

        r = Reader(read_json(file, what="group index"), str(file), "index")
        r.only("format", "cases", "groups")
        if r.text("format") != INDEX_FORMAT:
            raise r.fail("format", f"expected {INDEX_FORMAT!r}")
        groups = [
            GroupRecord.from_json(g, f"{file} groups[{i}]")
            for i, g in enumerate(r.items("groups", max_items=100_000))
        ]
        return r.integer("cases", 0, minimum=0) or 0, groups

    def findings(self) -> Iterator[LoggedFinding]:
        """Every logged finding (a torn last line is skipped)."""
        if not self.findings_log.is_file():
            return
        source = str(self.findings_log)
        with self.findings_log.open(encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    continue
                yield LoggedFinding.from_json(data, f"{source}:{n}")


def finding_by_digest(root: Path, digest: str) -> LoggedFinding:
    """The logged finding whose case digest starts with ``digest``."""
    matching = [f for f in RunDirectory(root).findings() if f.digest.startswith(digest)]
    if not matching:
        raise FormatError(str(root / FINDINGS_LOG), f"no finding with digest {digest!r}")
    return matching[0]


def repro_of(finding: LoggedFinding, paths: Sequence[str]) -> Repro:
    """A repro file for a logged finding (what replay and shrink take)."""
    from difftest.model.outcome import CaseResult, Finding

    return Repro(
        case=finding.case,
        status="finding",
        paths=tuple(paths),
        finding=Finding(
            path=finding.result.path, kind=finding.result.outcome, reason=finding.result.reason
        ),
        result=CaseResult(case_digest=finding.digest, results=(finding.result,)),
        launch=finding.launch,
    )
