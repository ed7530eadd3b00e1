"""difftest: differential testing of the attention kernels used in speculative decoding.

The public API: the case model, registering a kernel path, materialising a batch, the oracle's
output for it, evaluating a case through paths, and the one-call check for user tests.

Names are imported on first use, so that importing ``difftest`` (as the pytest plugin does in
every test session of an environment where it is installed) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from difftest.compare import Tolerance, reference
    from difftest.errors import DifftestError, ExitCode
    from difftest.materializer import materialize
    from difftest.outcome import CaseResult, Outcome, PathResult
    from difftest.paths import KernelPath, Precision, get_path, register_path, unregister
    from difftest.runner import evaluate
    from difftest.usercheck import CheckFailed, check

_SOURCES = {
    "Batch": "difftest.batch",
    "AttentionConfig": "difftest.case",
    "BatchSpec": "difftest.case",
    "Case": "difftest.case",
    "CausalDraft": "difftest.case",
    "PoolSpec": "difftest.case",
    "TreeDraft": "difftest.case",
    "ValueSpec": "difftest.case",
    "Tolerance": "difftest.compare",
    "reference": "difftest.compare",
    "DifftestError": "difftest.errors",
    "ExitCode": "difftest.errors",
    "materialize": "difftest.materializer",
    "CaseResult": "difftest.outcome",
    "Outcome": "difftest.outcome",
    "PathResult": "difftest.outcome",
    "KernelPath": "difftest.paths",
    "Precision": "difftest.paths",
    "get_path": "difftest.paths",
    "register_path": "difftest.paths",
    "unregister": "difftest.paths",
    "evaluate": "difftest.runner",
    "CheckFailed": "difftest.usercheck",
    "check": "difftest.usercheck",
}

__all__ = [
    "AttentionConfig",
    "Batch",
    "BatchSpec",
    "Case",
    "CaseResult",
    "CausalDraft",
    "CheckFailed",
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
    "check",
    "evaluate",
    "get_path",
    "materialize",
    "reference",
    "register_path",
    "unregister",
]


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'difftest' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
