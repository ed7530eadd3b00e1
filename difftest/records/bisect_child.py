"""The interpreter ``difftest bisect`` starts for one library version: say which FlashInfer it
imported, then replay each repro on its finding's path and write the verdicts, the repros of
cheap builds first (:func:`cheap_first`).

``python -m difftest.records.bisect_child OUT.json --site DIR [--paths a,b] [--plugin M]...
[--device D] [--isolation process|none] [--deadline-s S] REPRO...``

The parent puts ``DIR`` first on ``PYTHONPATH`` and points FlashInfer's JIT cache at this
version's folder; this process checks that ``flashinfer`` really comes from ``DIR``. ``OUT``
(written again after each repro, so a process that dies part way leaves what it finished)::

    {"format": "difftest-bisect-child/1",
     "flashinfer": {"version": "0.7.4", "file": ".../flashinfer/__init__.py", "problem": ""},
     "rows": [{"file": ..., "verdict": "still_fails", "detail": ..., "observed": "WRONG",
               "recorded": "WRONG", "error": ""}, ...]}

``problem`` is set when FlashInfer cannot be imported from ``DIR`` (then no repro is run).
Exit codes: 0 the repros were replayed (whatever the verdicts), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from difftest.model.errors import DifftestError, ExitCode
from difftest.records.atomic import write_json

CHILD_FORMAT = "difftest-bisect-child/1"


def probe_flashinfer(site: Path) -> dict[str, str]:
    """The FlashInfer this interpreter imports, and whether it is the one in ``site``."""
    try:
        module = importlib.import_module("flashinfer")
    except Exception as e:  # a broken install may raise anything
        return {"version": "", "file": "", "problem": f"flashinfer is not importable: {e}"}
    file = str(getattr(module, "__file__", "") or "")
    version = str(getattr(module, "__version__", "") or "")
    problem = ""
    if not file or not Path(file).resolve().is_relative_to(site.resolve()):
        problem = f"flashinfer was imported from {file or 'nowhere'}, not from the site {site}"
    elif not version:
        problem = f"the flashinfer in {site} has no __version__"
    return {"version": version, "file": file, "problem": problem}


def _replay_one(file: str, args: argparse.Namespace) -> dict[str, Any]:
    from difftest.execution.session import Session, Settings
    from difftest.records.replay import replay_repro
    from difftest.records.repro import load_repro

    row: dict[str, Any] = {"file": file, "verdict": "", "detail": "", "observed": ""}
    row |= {"recorded": "", "error": ""}
    try:
        repro = load_repro(Path(file))
        signature = repro.signature()
        row["recorded"] = signature.kind.value if signature else ""
        # Only the row's path is judged (the finding's own, or the first asked for): the
        # repro's other recorded paths would only add their builds.
        names = tuple(n for n in (args.paths or "").split(",") if n) or (
            (signature.path,) if signature else None
        )
        settings = Settings(
            device=args.device,
            plugins=tuple(args.plugin),
            isolation=args.isolation,
            deadline_s=args.deadline_s,
        )
        with Session(settings) as session:
            outcomes = replay_repro(repro, session, source=file, paths=names)
    except DifftestError as e:
        row["error"] = str(e)
        return row
    first = outcomes[0]  # the finding's own path (or the first one asked for)
    row["verdict"] = first.verdict.name.lower()
    row["detail"] = first.detail
    row["observed"] = first.observed.kind.value if first.observed else ""
    return row


def cheap_first(files: Sequence[str]) -> list[str]:
    """``files`` in order of the cold build cost of their finding's path, cheapest first
    (ties in the order given): one slow build (FMHAv2's takes minutes) then cannot leave the
    repros after it unjudged when the version's time runs out. A repro that does not load
    costs nothing here (its replay reports the error at once)."""
    from difftest.paths import get_path
    from difftest.records.repro import load_repro

    def cost(file: str) -> float:
        try:
            repro = load_repro(Path(file))
        except DifftestError:
            return 0.0
        signature = repro.signature()
        names = (signature.path,) if signature else repro.paths
        costs = []
        for name in names:
            try:
                costs.append(get_path(name).build_cost_s)
            except DifftestError:  # a path of a plugin not loaded: its replay says so
                costs.append(0.0)
        return max(costs, default=0.0)

    return sorted(files, key=cost)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m difftest.records.bisect_child")
    parser.add_argument("out", type=Path)
    parser.add_argument("repros", nargs="*")
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--paths", default=None)
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--device", default=None)
    parser.add_argument("--isolation", choices=["process", "none"], default="process")
    parser.add_argument("--deadline-s", type=float, default=None)
    args = parser.parse_intermixed_args(argv)
    report: dict[str, Any] = {
        "format": CHILD_FORMAT,
        "flashinfer": probe_flashinfer(args.site),
        "rows": [],
    }
    write_json(args.out, report)
    if report["flashinfer"]["problem"]:
        return ExitCode.OK
    try:
        from difftest.paths import load_plugin

        for spec in args.plugin:  # a repro's recorded plugins are data, never imported
            load_plugin(spec)
    except DifftestError as e:
        sys.stderr.write(f"difftest: error: {e}\n")
        return ExitCode.USAGE
    for file in cheap_first(args.repros):
        report["rows"].append(_replay_one(file, args))
        write_json(args.out, report)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
