"""``benchmarks/launch_memory.py`` off a GPU: its one-line refusal, and the frames it names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "launch_memory.py"


def _module():
    spec = importlib.util.spec_from_file_location("launch_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the refusal is what a machine without CUDA gets"
)
def test_without_a_cuda_device_it_says_so_in_one_line_and_exits_3(capsys) -> None:
    assert _module().main([]) == 3
    err = capsys.readouterr().err
    assert err == "launch_memory: no CUDA device\n"


def test_an_allocation_is_named_by_its_innermost_difftest_and_flashinfer_frames() -> None:
    frames = _module()._frames
    block = {
        "frames": [
            {
                "filename": "/usr/lib/python3/site-packages/torch/cuda/memory.py",
                "line": 9,
                "name": "empty",
            },
            {"filename": "/w/difftest/execution/packing.py", "line": 202, "name": "launch_pool"},
            {"filename": "/env/site-packages/flashinfer/xqa.py", "line": 77, "name": "xqa"},
            {"filename": "/w/difftest/execution/evaluate.py", "line": 154, "name": "_materialize"},
        ]
    }
    assert frames(block, keep=2) == (
        "execution/packing.py:202(launch_pool) < flashinfer/xqa.py:77(xqa)"
    )
    assert frames({"frames": [{"filename": "/torch/x.py", "line": 1, "name": "f"}]}) == (
        "(no difftest/flashinfer frame)"
    )
