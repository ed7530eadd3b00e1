"""The stored verdict list (``tests/data/verdicts.json``) judged on a GPU: speed must not
change a verdict there either.

    python ci/gpu_verdicts.py OUT.json [--device cuda]

Evaluates every stored case and packed launch on the device with the stored list's paths (the
two torch paths and the mutant kernels, all plain torch: on a GPU the generation, the oracle,
the noise floors and the judgement run there) and writes each verdict (outcome, detail, the
wrong requests) to OUT.json, with how many differ from the stored ones, which were computed on
a CPU. Run it under two checkouts (``PYTHONPATH=OTHER python ci/gpu_verdicts.py ...``) and
compare the two files to see what a change of code changed on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "unit"))

import test_verdict_stability as stored_list

from difftest.execution.evaluate import evaluate, evaluate_pack
from difftest.model.case import Case


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    dev = torch.device(args.device)
    data = stored_list._stored()
    cases, launches, differ = [], [], []
    for n, entry in enumerate(data["cases"]):
        case = Case.from_json(entry["case"])
        got = stored_list.verdicts(evaluate(case, stored_list._paths(case), dev))
        cases.append(got)
        differ += [f"case {n} {k}" for k in got if got[k] != entry["verdicts"].get(k)]
    for n, entry in enumerate(data["launches"]):
        group = [Case.from_json(c) for c in entry["cases"]]
        got_all = [
            stored_list.verdicts(r) for r in evaluate_pack(group, stored_list._paths(group[0]), dev)
        ]
        launches.append(got_all)
        for i, (got, want) in enumerate(zip(got_all, entry["verdicts"], strict=True)):
            differ += [f"launch {n} case {i} {k}" for k in got if got[k] != want.get(k)]
    total = sum(len(v) for v in cases) + sum(len(v) for g in launches for v in g)
    args.out.write_text(
        json.dumps({"device": str(dev), "cases": cases, "launches": launches, "differ": differ})
    )
    print(f"{total} verdicts on {dev}; {len(differ)} differ from the stored (CPU) ones")
    for line in differ[:40]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
