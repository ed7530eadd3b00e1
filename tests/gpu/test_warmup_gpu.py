"""On the GPU, the warmup compiles the fused oracle's Triton kernels, not only a path's module.

A campaign's workers load a Triton kernel from the on-disk cache when it is there and compile
it when it is not, each on its own: four workers meeting the oracle's kernels at their first
case compiled them side by side (Run 36). So the warmup (and compile-ahead, which builds
through the same function) runs the oracle once per build. Checked in a fresh process with an
empty ``TRITON_CACHE_DIR``: after ``warm_up`` of one case on ``torch-sdpa`` the cache holds
the oracle's three kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import torch
from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution.warmup import warm_up
from difftest.generation.strategies import LIMITS
from difftest.paths.registry import get_path

dev, path = torch.device("cuda"), get_path("torch-sdpa")
config = CampaignConfig(seed=3, limits=LIMITS["cpu"])
case = next(c for _, c in planned_cases(config, dev) if path.support(c, dev) is None)
results = warm_up([case], [path], dev)
assert results and not any(r.error for r in results), results
"""


def test_warmup_leaves_the_oracle_kernels_in_tritons_cache(tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = {p.name for p in cache.rglob("*") if p.is_file()}
    for kernel in ("maxima", "sums", "combine"):
        assert any(n.startswith(kernel + ".") for n in names), (kernel, sorted(names)[:40])
