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


def test_a_launch_file_is_read_as_untrusted_input_before_the_device_is_asked_for(
    tmp_path: Path, capsys
) -> None:
    """``--launch`` takes a packed repro file, read as every repro file is: a malformed one and
    one with no launch are exit 2 with one line, wherever it runs; a good one is read (then, on
    this machine, the missing GPU is exit 3)."""
    import dataclasses

    from difftest.execution.packing import packable
    from difftest.model.case import AttentionConfig, BatchSpec, Case, PoolSpec
    from difftest.records.repro import Repro, write_repro

    main = _module().main
    bad = tmp_path / "bad.repro.json"
    bad.write_text('{"format": 1, "case": ')
    assert main(["--launch", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("launch_memory: ") and err.count("\n") == 1 and "Traceback" not in err

    first = Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=2),
        pool=PoolSpec(table_width="context", context_len=16),  # one width for the launch
    )
    second = first.replace(batch=dataclasses.replace(first.batch, prefix_lens=(7,)), seed=3)
    assert packable([first, second]) is None
    alone = write_repro(tmp_path, Repro(case=first, status="running", paths=("torch-sdpa",)))
    assert main(["--launch", str(alone)]) == 2
    assert "not a packed repro file" in capsys.readouterr().err
    packed = write_repro(
        tmp_path / "p",
        Repro(case=first, status="running", paths=("torch-sdpa",), launch=(first, second)),
    )
    if not torch.cuda.is_available():
        assert main(["--launch", str(packed)]) == 3  # read, then no device
        assert capsys.readouterr().err == "launch_memory: no CUDA device\n"


@pytest.mark.parametrize("storage", ["hnd", "nhd", "kv_split_nhd"])
def test_the_made_up_launch_splits_its_requests_into_cases_that_share_one_launch(
    storage: str,
) -> None:
    import argparse

    from difftest.execution.packing import packable

    module = _module()
    args = argparse.Namespace(requests=10, prefix=30, cases=3, plain_pool=False)
    cases = module._made_up(args, storage)
    assert [len(c.batch.prefix_lens) for c in cases] == [4, 4, 2]
    assert [p for c in cases for p in c.batch.prefix_lens] == [30 + 7 * i for i in range(10)]
    assert packable(cases) is None
    assert all(c.pool.kv_storage == storage and c.pool.page_order == "shuffled" for c in cases)
    plain = module._made_up(
        argparse.Namespace(requests=10, prefix=30, cases=1, plain_pool=True), storage
    )
    assert len(plain) == 1 and plain[0].pool.page_order == "sequential"
