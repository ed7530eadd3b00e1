"""What a path does in the production modes: ragged verify, skip-softmax, CUDA-graph replay.

Every :class:`~difftest.paths.registry.KernelPath` carries a :class:`PathModes`. Its defaults
are what a path that knows nothing of the modes does: it takes no ragged batch (it may read
``batch.q_len`` as every request's row count), it computes exact attention whatever the
skip-softmax factor, and under a graph replay it is called again, the same way, on the static
buffers (the kernel sees what a graph replay gives it, without a CUDA graph being captured).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from difftest.model.batch import Batch
from difftest.model.case import Case

SkipSoftmax = Literal["honours", "ignores"]
"""``honours``: the path skips KV tiles as ``skip_softmax_threshold_scale_factor`` allows (and
is held to the exact tolerance plus the skip allowance); ``ignores``: it computes exact
attention (and is reported ``IGNORES`` when the case sets the factor)."""

ModeFn = Callable[[Case, torch.device], "str | None"]
"""``(case, device) -> None`` when the path takes the case in this mode, else why not."""
SkipFn = Callable[[Case, torch.device], SkipSoftmax]
Replay = Callable[[Batch], torch.Tensor]
"""Replays a captured call once the new values are in the static buffers; gets the loaded
batch (the static buffers' views, the capture's host arguments) and returns the output."""
CaptureFn = Callable[[Batch], Replay]
"""Captures the path's call over a batch of static buffers (a CUDA graph on a GPU) and returns
how to replay it."""


def accepts(case: Case, device: torch.device) -> str | None:
    """A :data:`ModeFn` for a path that takes every case in the mode."""
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class PathModes:
    """A path's production modes (see the module docstring for the defaults)."""

    ragged: ModeFn | None = None
    """Which ragged batches (requests with different numbers of new tokens) the path takes;
    ``None``: none."""
    skip_softmax: SkipFn | None = None
    """Whether it applies the skip-softmax factor; ``None``: it ignores it."""
    capture: CaptureFn | None = None
    """How it is captured for a graph replay; ``None``: it is called again on the static
    buffers."""
    capture_limits: ModeFn | None = None
    """Which graph cases its capture takes (``None``: every one)."""

    def reason(self, path: str, case: Case, device: torch.device) -> str | None:
        """Why ``path`` does not take ``case`` in the case's modes, or ``None``."""
        if case.batch.is_ragged:
            if self.ragged is None:
                return (
                    f"{path} takes no ragged batch (requests with different numbers of new "
                    "tokens): it declares no ragged support"
                )
            reason = self.ragged(case, device)
            if reason is not None:
                return reason
        if case.graph is not None and self.capture_limits is not None:
            reason = self.capture_limits(case, device)
            if reason is not None:
                return f"graph capture: {reason}"
        return None

    def skip(self, case: Case, device: torch.device) -> SkipSoftmax:
        """Whether the path applies the case's skip-softmax factor."""
        return "ignores" if self.skip_softmax is None else self.skip_softmax(case, device)
