"""The flushed-row check on a GPU (docs/validation.md, Run 18): the H200 campaign's XQA case
whose request 131 has only subnormal float32 probabilities, and the one-request case of
tests/unit/test_subnormal_probabilities.py, through every GPU path that takes them. Prints per
path the verdict under the current noise floor, the largest |output| and |oracle| on the
flushed rows, and whether the path wrote exact zeros there.

    python ci/h200_subnormal_row.py [PATHS]

PATHS: comma-separated (default fi-decode-xqa,fi-prefill-fa2,fi-decode-wrapper). Without
a GPU it runs on the CPU (for the CPU paths: torch-sdpa,torch-paged-online).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_subnormal_probabilities import CAMPAIGN_REPRO, SINK_CASE  # noqa: E402

from difftest.execution.evaluate import evaluate  # noqa: E402
from difftest.generation.materialize import materialize  # noqa: E402
from difftest.judgement.tolerance import oracle_outputs  # noqa: E402
from difftest.model.case import Case  # noqa: E402
from difftest.paths.registry import get_path  # noqa: E402


def main() -> None:
    names = sys.argv[1] if len(sys.argv) > 1 else "fi-decode-xqa,fi-prefill-fa2,fi-decode-wrapper"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = {
        "campaign case, request 131": (
            Case.from_json(json.loads(CAMPAIGN_REPRO.read_text())["case"]),
            131,
        ),
        "one-request sink case": (Case.from_json(SINK_CASE), 0),
    }
    for label, (case, request) in cases.items():
        batch = materialize(case, device)
        ref, _ = oracle_outputs(batch, [])
        L = case.batch.q_len
        rows = slice(request * L, (request + 1) * L)
        print(f"== {label}: |oracle| max on the rows {float(ref[rows].abs().max()):.3g}")
        for name in names.split(","):
            path = get_path(name)
            why = path.support(case, device)
            if why is not None:
                print(f"  {name}: not run: {why}")
                continue
            out = path.run(materialize(case, device)).double()
            verdict = evaluate(case, [path], device).results[0]
            zero = bool((out[rows] == 0).all())
            print(
                f"  {name}: {verdict.outcome.value} {verdict.reason}; |out| max on the rows "
                f"{float(out[rows].abs().max()):.3g}, exact zeros: {zero}"
            )


if __name__ == "__main__":
    main()
