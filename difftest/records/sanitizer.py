"""Rerun a repro under compute-sanitizer's memcheck and keep its first records.

A ``CRASH`` from an illegal memory access says that something read or wrote out of bounds,
not what. Memcheck names the kernel, the thread, the access size and how far outside which
allocation the address was. PyTorch's caching allocator hides small overruns inside its big
blocks, so it is switched off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``). The repro runs in a child
process (:mod:`difftest.records.sanitize_child`) that compute-sanitizer launches; its
report
goes to a log file that :func:`parse_sanitizer_output` reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import difftest

SANITIZER = "compute-sanitizer"
RESULT_MARKER = "DIFFTEST-SANITIZE-RESULT "
"""The child prints its :class:`~difftest.model.outcome.CaseResult` JSON after this on stdout."""
MAX_RECORDS = 8
DEFAULT_TOOLKIT = "/usr/local/cuda"
_CONTINUATIONS = ("at ", "by thread", "Address ", "Access to ", "and is ")
_PREFIX = re.compile(r"^=+ ?")
_NOT_RECORDS = (
    "COMPUTE-SANITIZER",
    "CUDA-MEMCHECK",
    "ERROR SUMMARY",
    "LEAK SUMMARY",
    "Target application",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SanitizerRecord:
    """One memcheck error block: ``kind`` is its first line (``Invalid __global__ read of
    size 2 bytes``); ``where``, ``thread`` and ``address`` its ``at``, ``by thread`` and
    ``Access to``/``Address`` lines (empty when absent); ``lines`` the first block without
    host frames."""

    kind: str
    where: str = ""
    thread: str = ""
    address: str = ""
    lines: tuple[str, ...] = ()
    repeats: int = 1
    """How many records of this kind at this place there were (one per thread)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "where": self.where,
            "thread": self.thread,
            "address": self.address,
            "lines": list(self.lines),
            "repeats": self.repeats,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SanitizerReport:
    """What a sanitized rerun found. ``available`` is false when compute-sanitizer is not
    installed (then ``summary`` says so and nothing ran)."""

    available: bool
    summary: str
    """One line for the user: the error summary, or why there is none."""
    command: tuple[str, ...] = ()
    returncode: int | None = None
    timed_out: bool = False
    records: tuple[SanitizerRecord, ...] = ()
    error_count: int | None = None
    """From ``ERROR SUMMARY: N errors`` (``None``: no summary line, e.g. killed)."""
    result: dict[str, Any] | None = None
    """The child's :class:`~difftest.model.outcome.CaseResult` JSON, when it got that far."""
    output_tail: tuple[str, ...] = field(default_factory=tuple)
    """The last lines the child printed (its errors, when it failed)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "summary": self.summary,
            "command": list(self.command),
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "error_count": self.error_count,
            "records": [r.to_json() for r in self.records],
            "result": self.result,
            "output_tail": list(self.output_tail),
        }


def find_sanitizer() -> str | None:
    """``compute-sanitizer`` on PATH, else under ``$CUDA_HOME/bin`` or the default toolkit."""
    found = shutil.which(SANITIZER)
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_TOOLKIT):
        if root:
            candidate = Path(root) / "bin" / SANITIZER
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def parse_sanitizer_output(
    text: str, limit: int = MAX_RECORDS
) -> tuple[list[SanitizerRecord], int | None]:
    """The first ``limit`` distinct error records of compute-sanitizer's text output and the
    count of its ``ERROR SUMMARY`` line. A record starts at an unindented ``=========`` line
    and takes the indented lines after it; banner, summaries and host backtraces are left out.
    Records of the same kind at the same place (one per thread of a bad access) are one
    record with ``repeats`` counting them."""
    blocks: list[list[str]] = []
    count: int | None = None
    block: list[str] = []

    def flush() -> None:
        if block:
            blocks.append(list(block))
        block.clear()

    for raw in text.splitlines():
        if not raw.startswith("====="):
            continue  # the application's own output, interleaved
        body = _PREFIX.sub("", raw, count=1).rstrip()
        if not body.strip():
            flush()
            continue
        if body[0].isspace() or (block and body.startswith(_CONTINUATIONS)):
            if block and not _is_backtrace(body):
                block.append(body.strip())
            continue
        flush()
        summary = re.match(r"ERROR SUMMARY:\s*(\d+)", body)
        if summary:
            count = int(summary.group(1))
        if not body.startswith(_NOT_RECORDS):
            block.append(body)
    flush()
    records: dict[tuple[str, str], SanitizerRecord] = {}
    for lines in blocks:
        record = _record(lines)
        key = (record.kind, record.where)
        if key in records:
            records[key] = dataclasses.replace(records[key], repeats=records[key].repeats + 1)
        elif len(records) < limit:
            records[key] = record
    return list(records.values()), count


def _is_backtrace(line: str) -> bool:
    text = line.strip()
    return text.startswith(("Host Frame", "Device Frame", "Saved host backtrace")) or bool(
        re.match(r"#\d+ ", text)
    )


def _record(block: list[str]) -> SanitizerRecord:
    def first(prefix: str) -> str:
        return next((line for line in block[1:] if line.startswith(prefix)), "")

    return SanitizerRecord(
        kind=block[0],
        where=first("at "),
        thread=first("by thread"),
        address=first("Address") or first("Access to"),
        lines=tuple(block[:12]),
    )


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    root = str(Path(difftest.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_under_sanitizer(
    repro_file: Path,
    paths: list[str],
    plugins: list[str],
    timeout_s: float,
    *,
    device: str = "cuda",
    sanitizer: str | None = None,
) -> SanitizerReport:
    """Rerun ``repro_file`` through ``paths`` (empty: the repro's own) under
    ``compute-sanitizer --tool memcheck`` and report its first records.

    ``plugins``: ``--plugin`` specs for the child to import. ``sanitizer``: the executable
    (default: :func:`find_sanitizer`). Never raises for what the child does: a child that
    fails, crashes or overruns ``timeout_s`` is described in the report.
    """
    exe = sanitizer or find_sanitizer()
    if exe is None:
        return SanitizerReport(
            available=False,
            summary="compute-sanitizer is not installed (not on PATH, nor in $CUDA_HOME/bin): "
            "the repro was not rerun under memcheck",
        )
    with tempfile.TemporaryDirectory(prefix="difftest-sanitize-") as tmp:
        log_file = Path(tmp) / "memcheck.log"
        child = [
            sys.executable,
            "-m",
            "difftest.records.sanitize_child",
            str(repro_file),
        ]
        child += ["--device", device]
        if paths:
            child += ["--paths", ",".join(paths)]
        for spec in plugins:
            child += ["--plugin", spec]
        command = [exe, "--tool", "memcheck", "--log-file", str(log_file), *child]
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_child_env(),
            start_new_session=True,
        )
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        text = out.decode("utf-8", "replace")
        log_text = log_file.read_text("utf-8", "replace") if log_file.exists() else text
    records, count = parse_sanitizer_output(log_text)
    result = _child_result(text)
    lines = [line for line in text.splitlines() if line.strip() and RESULT_MARKER not in line]
    if timed_out:
        summary = f"timed out after {timeout_s:.0f}s"
    elif count is not None:
        summary = f"ERROR SUMMARY: {count} error{'s' if count != 1 else ''}"
    else:
        summary = f"no error summary (exit code {proc.returncode})"
    if records:
        first = records[0]
        summary += f"; first: {first.kind}" + (f" {first.where}" if first.where else "")
        if first.repeats > 1:
            summary += f" ({first.repeats} times)"
    return SanitizerReport(
        available=True,
        summary=summary,
        command=tuple(command),
        returncode=proc.returncode,
        timed_out=timed_out,
        records=tuple(records),
        error_count=count,
        result=result,
        output_tail=tuple(line[:300] for line in lines[-20:]),
    )


def _child_result(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            try:
                data = json.loads(line[len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None
