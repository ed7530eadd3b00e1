"""The process compute-sanitizer launches: replay one repro in-process and print the result.

``python -m difftest.records.sanitize_child REPRO [--paths a,b] [--plugin M]...
[--device D]``

Prints one line ``DIFFTEST-SANITIZE-RESULT <CaseResult JSON>`` on stdout. Exit codes: 0 the
case ran (whatever its verdicts), 2 the repro, a plugin or a path name is bad. A crash is left
to kill the process: the sanitizer's report is what the caller wants.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from difftest.model.errors import DifftestError, ExitCode
from difftest.records.sanitizer import RESULT_MARKER


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m difftest.records.sanitize_child")
    parser.add_argument("repro")
    parser.add_argument("--paths", default=None, help="comma-separated (default: the repro's)")
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    try:
        from difftest.execution.evaluate import evaluate
        from difftest.paths import load_plugin, resolve
        from difftest.records.repro import load_repro

        repro = load_repro(args.repro)
        for spec in args.plugin:  # a repro's recorded plugins are data, never imported
            load_plugin(spec)
        names = args.paths.split(",") if args.paths else list(repro.paths)
        paths = resolve(names)
        result = evaluate(repro.case, paths, args.device)
    except DifftestError as e:
        sys.stderr.write(f"difftest: error: {e}\n")
        return ExitCode.USAGE
    sys.stdout.write(RESULT_MARKER + json.dumps(result.to_json()) + "\n")
    sys.stdout.flush()
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
