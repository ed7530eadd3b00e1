"""``difftest explain FILE``: the error map of a finding, as text and (with matplotlib) a PNG.

The map comes from a rerun of the finding's path when it can run on this machine, else from the
metrics stored in the repro. Before the rerun that draws the map, the path runs once isolated:
a finding whose path crashes or hangs on its case is reported (exit 1) instead of taking the
command with it. Exit codes: 0 explained, 1 the path crashes or hangs on the case, 2 bad input
(a malformed file, a plugin not given with ``--plugin``) or ``--png`` without matplotlib.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.execution.interrupts import handling_signals
from difftest.execution.session import Session
from difftest.interfaces.commands._session_options import add_session_arguments, session_settings
from difftest.judgement.tolerance import Tolerance
from difftest.model.case import Case
from difftest.model.errors import DifftestError, ExitCode, SetupError
from difftest.model.outcome import Outcome
from difftest.paths.registry import all_paths
from difftest.records.atomic import write_json
from difftest.records.replay import missing_paths, plugin_given, replay_repro
from difftest.records.repro import load_repro, load_tensors, write_repro
from difftest.records.run_dir import check_output_file
from difftest.records.untrusted import check_fits
from difftest.triage.explain import ErrorMap, error_map, explain_lines
from difftest.triage.location import locate_pages

HELP = "print where a repro's error is (rows, heads, visible KV, pages); --png for a heatmap"
LOST = (Outcome.CRASH, Outcome.HANG)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, metavar="FILE", help="a repro file")
    p.add_argument("--png", type=Path, default=None, help="write a heatmap of |err| here")
    p.add_argument("--json", type=Path, default=None, help="write the error map as JSON here")
    p.add_argument(
        "--no-rerun",
        action="store_true",
        help="do not rerun the path: use the output stored with the repro, else its metrics",
    )
    p.add_argument(
        "--save-output",
        action="store_true",
        help="store the rerun's kernel output with the repro (a safetensors sidecar), so the "
        "full map can be drawn where the path cannot run",
    )
    add_session_arguments(p)


def main(args: argparse.Namespace) -> int:
    repro = load_repro(args.file)
    if repro.finding is None:
        raise DifftestError(f"{args.file}: a pending repro has no finding to explain")
    for flag in ("json", "png"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), f"--{flag}")
    rerun = not args.no_rerun
    registered = any(p.name == repro.finding.path for p in all_paths())
    if rerun and not registered:
        if any(not plugin_given(spec, tuple(args.plugin)) for spec in repro.plugins):
            missing_paths([repro.finding.path], repro, tuple(args.plugin))  # names them: exit 2
    stored = load_tensors(repro, args.file) if repro.tensors is not None else None
    settings = session_settings(args, paths=(repro.finding.path,) if rerun and registered else ())
    with handling_signals() as interrupts, Session(settings, interrupts=interrupts) as session:
        device = session.device
        if rerun and registered and session.runnable:
            check_fits(repro.case, device, str(args.file))
            # The rerun that draws the map runs here, in this process: first run the path
            # once in the session's (isolated) executor, so a path that crashes or hangs on
            # the case is reported as such instead of taking this command with it.
            [first] = replay_repro(repro, session, source=str(args.file))
            if first.result is not None and first.result.outcome in LOST:
                print(first.line())
                did = "crashes" if first.result.outcome is Outcome.CRASH else "hangs"
                print(f"no error map: the path {did} on this case")
                return ExitCode.FINDINGS
    emap = error_map(
        repro.case,
        repro.finding,
        device,
        recorded=repro.path_result(),
        tolerance=Tolerance(),
        rerun=rerun,
        stored=stored,
    )
    for line in explain_lines(repro.case, repro.finding, emap):
        print(line)
    if args.json is not None:
        heat = emap.heatmap(repro.case)
        write_json(
            args.json,
            {
                "source": emap.source,
                "errors": [x.to_json() for x in locate_pages(repro.case, emap.errors)],
                "diagnoses": {f"{b}:{r}": d for (b, r), d in (emap.diagnoses or {}).items()},
                "heatmap": heat.tolist(),
            },
        )
    if args.save_output:
        if emap.output is None or emap.bound is None or not emap.source.startswith("rerun"):
            raise DifftestError(
                f"--save-output needs a rerun here; the map came from {emap.source}"
            )
        tensors = {"out": emap.output, "bound": emap.bound}
        write_repro(args.file.parent, repro, tensors, file_name=args.file.name)
        print(f"output stored with {args.file}")
    if args.png is not None:
        print(f"heatmap: {write_heatmap(emap, repro.case, args.png)}")
    return ExitCode.OK


def write_heatmap(emap: ErrorMap, case: Case, file: Path) -> Path:
    """A PNG of :meth:`ErrorMap.heatmap` (query rows down, heads across, requests separated by
    lines). Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SetupError(
            "--png needs matplotlib, which is not installed (pip install 'difftest[plot]')"
        ) from None
    grid = emap.heatmap(case).clamp_max(1e6).numpy()
    L = case.batch.q_len
    fig, ax = plt.subplots(figsize=(2 + 0.4 * grid.shape[1], 1.5 + 0.25 * grid.shape[0]))
    image = ax.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="max |err| / bound (> 1 is wrong)")
    for start in case.batch.first_rows()[1:-1]:
        ax.axhline(start - 0.5, color="cyan", linewidth=0.5)
    ax.set_xlabel("query head")
    ax.set_ylabel(f"query row (request x {L} + row)" if not case.batch.is_ragged else "query row")
    ax.set_title(f"case {case.digest()}: {emap.source}", fontsize=8)
    file.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(file, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return file
