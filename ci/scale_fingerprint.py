"""On any machine: do a repro's recorded errors match a known scale misuse?

For each repro file, the float64 oracle is rerun on the repro's tensors with the scales a
kernel might have misapplied, rounded to the output dtype, and its max |error| against the
correct oracle is printed beside the error the kernel showed (``result`` of the repro):

- ``no_bmm2``: ``softmax(bmm1_scale * q.k) @ v``, bmm2_scale never applied;
- ``bmm1/bmm2``: ``softmax((bmm1_scale / bmm2_scale) * q.k) @ v``, bmm2_scale never applied
  (the XQA finding in docs/validation.md).

A kernel with that misuse shows the same error to within its own rounding. No GPU is needed.

Usage: python ci/scale_fingerprint.py REPRO ...
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import reference
from difftest.model.batch import Batch
from difftest.records.repro import load_repro


def misused_error(batch: Batch, truth: torch.Tensor, *, logits_divided: bool) -> float:
    """Max |error| against ``truth`` of the oracle with ``bmm2_scale`` never applied to the
    output (and, with ``logits_divided``, the logit scale divided by it), in the output dtype.
    The case's scales are swapped on the materialised batch, so its tensors stay the same."""
    a = batch.case.attention
    q_scale = a.q_scale / a.bmm2_scale if logits_divided else a.q_scale
    attention = dataclasses.replace(a, o_scale=a.v_scale, q_scale=q_scale)
    case = dataclasses.replace(batch.case, attention=attention)
    wrong = reference(dataclasses.replace(batch, case=case)).to(batch.out_dtype).double()
    return (wrong - truth).abs().max().item()


def main(files: list[str]) -> int:
    if not files:
        print("usage: scale_fingerprint.py REPRO ...", file=sys.stderr)
        return 2
    for file in files:
        repro = load_repro(file)
        if repro.finding is None:
            print(f"{file}: no finding")
            continue
        recorded = repro.path_result()
        found = recorded.metrics.max_abs if recorded else None
        shown = float("nan") if found is None else found
        batch = materialize(repro.case, "cpu")
        truth = reference(batch)
        print(
            f"{file}: {repro.finding.path} bmm2_scale={batch.bmm2_scale:.4g} "
            f"recorded max|err|={shown:.4g} "
            f"no_bmm2={misused_error(batch, truth, logits_divided=False):.4g} "
            f"bmm1/bmm2={misused_error(batch, truth, logits_divided=True):.4g}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
