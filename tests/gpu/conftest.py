"""GPU tests: skipped with the reason when there is no CUDA GPU or no FlashInfer.

Every test here is marked ``gpu``. Results are appended as JSON lines to
``$DIFFTEST_GPU_OUT/gpu_results.jsonl`` when that variable is set (the device runs point it at
``$OUT``), so a run cut short by its time limit still leaves its evidence.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch


def missing_requirement() -> str | None:
    """Why the GPU tests cannot run here, or ``None``."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch: tests/gpu needs one"
    try:
        importlib.import_module("flashinfer")
    except Exception as e:  # ImportError, or a broken install raising anything
        return f"flashinfer is not importable ({type(e).__name__}: {e}): tests/gpu needs it"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            reason = reason or missing_requirement()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="session")
def record() -> Any:
    """``record(row: dict)``: append one JSON line to the results file (if configured)."""
    out = os.environ.get("DIFFTEST_GPU_OUT")

    def write(row: dict[str, Any]) -> None:
        if out:
            with (Path(out) / "gpu_results.jsonl").open("a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")

    return write
