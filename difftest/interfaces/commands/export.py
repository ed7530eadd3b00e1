"""``difftest export FILE [-o script.py]``: a standalone script reproducing a finding with torch
and the kernel library alone, for filing upstream. Exit codes: 0 written, 2 bad input (a
malformed file, a plugin not given with ``--plugin``) or a path that cannot be exported."""

from __future__ import annotations

import argparse
from pathlib import Path

from difftest.model.errors import ExitCode
from difftest.records.atomic import write_text
from difftest.records.export import export_script
from difftest.records.replay import missing_paths
from difftest.records.repro import load_repro
from difftest.records.run_dir import check_output_file

HELP = "write a standalone Python script (torch + kernel library only) reproducing a finding"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", type=Path, metavar="FILE", help="a repro file")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="the script to write (default: the repro's name with .py)",
    )


def main(args: argparse.Namespace) -> int:
    repro = load_repro(args.file)
    out = args.output or args.file.with_suffix(".py")
    check_output_file(out, "--output")
    if repro.finding is not None:
        missing_paths([repro.finding.path], repro, tuple(args.plugin))
    script = export_script(repro, source=str(args.file))
    write_text(out, script)
    print(f"wrote {out}: run it with `python {out}` (prints PASS or FAIL)")
    return ExitCode.OK
