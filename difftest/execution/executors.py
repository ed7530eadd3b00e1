"""Executors: where a case's paths run. In this process, or (see
:mod:`difftest.execution.isolation`) in a
watched worker process that a crash or a hang cannot take down with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from difftest.execution.evaluate import evaluate, evaluate_pack
from difftest.judgement.tolerance import Tolerance
from difftest.model.case import Case
from difftest.model.outcome import CaseResult
from difftest.paths.registry import KernelPath


class Executor(Protocol):
    """Runs cases through a fixed list of paths on a fixed device."""

    paths: Sequence[KernelPath]
    device: torch.device

    def evaluate(self, case: Case, *, check_determinism: bool = False) -> CaseResult: ...

    def evaluate_pack(
        self, cases: Sequence[Case], *, check_determinism: bool = False
    ) -> list[CaseResult]:
        """Each case's verdict, the cases (packable, :mod:`difftest.execution.packing`) sharing one
        launch per path."""
        ...

    def close(self) -> None: ...


class InProcessExecutor:
    """Runs paths in the calling process: fastest, but a crash or hang takes the caller down."""

    def __init__(
        self,
        paths: Sequence[KernelPath],
        device: torch.device,
        tolerance: Tolerance | None = None,
    ) -> None:
        self.paths: Sequence[KernelPath] = list(paths)
        self.device = device
        self.tolerance = tolerance

    def evaluate(self, case: Case, *, check_determinism: bool = False) -> CaseResult:
        return evaluate(
            case,
            self.paths,
            self.device,
            tolerance=self.tolerance,
            check_determinism=check_determinism,
        )

    def evaluate_pack(
        self, cases: Sequence[Case], *, check_determinism: bool = False
    ) -> list[CaseResult]:
        return evaluate_pack(
            cases,
            self.paths,
            self.device,
            tolerance=self.tolerance,
            check_determinism=check_determinism,
        )

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
