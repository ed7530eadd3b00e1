"""difftest: differential testing of the attention kernels used in speculative decoding.

The public API: the case model, registering a kernel path, materialising a batch, the oracle's
output for it, evaluating a case through paths, and the one-call check for user tests.

Names are imported on first use, so that importing ``difftest`` (as the pytest plugin does in
every test session of an environment where it is installed) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from difftest.model.lazy import lazy_names

if TYPE_CHECKING:
    from difftest.execution.evaluate import evaluate
    from difftest.generation.materialize import materialize
    from difftest.interfaces.usercheck import CheckFailed, check
    from difftest.judgement.tolerance import Tolerance, reference
    from difftest.model.batch import Batch
    from difftest.model.case import (
        AttentionConfig,
        BatchSpec,
        Case,
        CausalDraft,
        PoolSpec,
        TreeDraft,
        ValueSpec,
    )
    from difftest.model.errors import DifftestError, ExitCode
    from difftest.model.graph_spec import GraphSpec
    from difftest.model.outcome import CaseResult, Outcome, PathResult
    from difftest.paths import KernelPath, Precision, get_path, register_path, unregister
    from difftest.paths.modes import PathModes

_SOURCES = {
    "Batch": "difftest.model.batch",
    "AttentionConfig": "difftest.model.case",
    "BatchSpec": "difftest.model.case",
    "Case": "difftest.model.case",
    "CausalDraft": "difftest.model.case",
    "PoolSpec": "difftest.model.case",
    "TreeDraft": "difftest.model.case",
    "ValueSpec": "difftest.model.case",
    "GraphSpec": "difftest.model.graph_spec",
    "PathModes": "difftest.paths.modes",
    "Tolerance": "difftest.judgement.tolerance",
    "reference": "difftest.judgement.tolerance",
    "DifftestError": "difftest.model.errors",
    "ExitCode": "difftest.model.errors",
    "materialize": "difftest.generation.materialize",
    "CaseResult": "difftest.model.outcome",
    "Outcome": "difftest.model.outcome",
    "PathResult": "difftest.model.outcome",
    "KernelPath": "difftest.paths",
    "Precision": "difftest.paths",
    "get_path": "difftest.paths",
    "register_path": "difftest.paths",
    "unregister": "difftest.paths",
    "evaluate": "difftest.execution.evaluate",
    "CheckFailed": "difftest.interfaces.usercheck",
    "check": "difftest.interfaces.usercheck",
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
    "GraphSpec",
    "KernelPath",
    "Outcome",
    "PathModes",
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


__getattr__, __dir__ = lazy_names(__name__, _SOURCES, __all__)
