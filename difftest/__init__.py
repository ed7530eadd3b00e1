"""difftest: differential testing of the attention kernels used in speculative decoding.

The public API: the case model, registering a kernel path, materialising a batch, the oracle's
output for it, and evaluating a case through paths.
"""

from __future__ import annotations

import torch

from difftest.batch import Batch
from difftest.case import (
    AttentionConfig,
    BatchSpec,
    Case,
    CausalDraft,
    PoolSpec,
    TreeDraft,
    ValueSpec,
)
from difftest.compare import Tolerance
from difftest.errors import DifftestError, ExitCode
from difftest.materialize import materialize
from difftest.outcome import CaseResult, Outcome, PathResult
from difftest.paths import KernelPath, Precision, get_path, register_path, unregister
from difftest.runner import evaluate


def reference(batch: Batch) -> torch.Tensor:
    """The float64 oracle's output ``[num_query_rows, H_q, D]`` for ``batch``."""
    from difftest.compare import reference as _reference

    return _reference(batch)


__all__ = [
    "AttentionConfig",
    "Batch",
    "BatchSpec",
    "Case",
    "CaseResult",
    "CausalDraft",
    "DifftestError",
    "ExitCode",
    "KernelPath",
    "Outcome",
    "PathResult",
    "PoolSpec",
    "Precision",
    "Tolerance",
    "TreeDraft",
    "ValueSpec",
    "evaluate",
    "get_path",
    "materialize",
    "reference",
    "register_path",
    "unregister",
]
