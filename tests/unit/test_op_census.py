"""The operation census (:mod:`difftest.execution.op_census`) and ``benchmarks/count_ops.py``.

The census is how a CPU tells what a launch would cost a GPU's host: the operations that
compute, the views, and the operations that make the host wait for the device.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from difftest.execution.op_census import Census, waits_for_device

ROOT = Path(__file__).resolve().parents[2]


def test_the_census_knows_a_wait_when_it_sees_one() -> None:
    """Each kind of wait, and their look-alikes that do not wait."""
    aten = torch.ops.aten
    x, mask = torch.arange(4), torch.tensor([True, False, True, False])
    counts = torch.tensor([1, 2, 0, 1])
    assert waits_for_device(aten.nonzero.default, (mask,), {})
    assert waits_for_device(aten.index.Tensor, (x, [mask]), {})
    assert not waits_for_device(aten.index.Tensor, (x, [counts]), {})
    assert waits_for_device(aten.repeat_interleave.self_Tensor, (x, counts), {})
    assert not waits_for_device(aten.repeat_interleave.self_Tensor, (x, counts), {"output_size": 4})
    assert not waits_for_device(aten.add.Tensor, (x, x), {})
    census = Census()
    with census:
        torch.tensor([1, 2, 3]), x[mask], x[counts], int(x.sum()), x + 1
    assert census.waits["other"] == 3  # the list, the boolean index, the read
    assert census.counts["other"] >= 5


def test_count_ops_prints_a_launch_by_part_and_no_wait_on_the_gpu_route() -> None:
    """The benchmark runs as documented, and on a GPU's route a whole packed launch
    (generation, packing, the oracle, two paths, the judgement, the pairs) dispatches no
    operation that waits for the device."""
    command = [sys.executable, "benchmarks/count_ops.py", "--limits", "cpu", "--pack", "4"]
    command += ["--launches", "2", "--gpu-route"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    head = done.stdout.splitlines()[0]
    found = re.search(r"([\d.]+) operations a case and ([\d.]+) views; ([\d.]+) would wait", head)
    assert found, head
    operations, views, waits = (float(x) for x in found.groups())
    assert operations > 0 and views > 0 and waits == 0.0, head
    parts = {line.split()[0] for line in done.stdout.splitlines()[2:]}
    assert {"generate", "agreeing", "paths", "pairs"} <= parts, done.stdout
