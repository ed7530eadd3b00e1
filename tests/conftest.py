"""Shared test settings: a fast, deterministic Hypothesis profile."""

from __future__ import annotations

import importlib.metadata
import os

import torch
from hypothesis import HealthCheck, settings

# Triton's interpreter runs the fused oracle's kernels on a CPU
# (tests/unit/test_oracle_fused.py). `triton.jit` reads TRITON_INTERPRET when it decorates a
# function, Triton's own library functions included, so the variable is set before anything
# imports Triton, and only where no CUDA GPU is visible (there Triton kernels run for real).
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# One intra-op thread per test process: pytest -n auto already uses every core, and torch's
# own threads on top of that made CPU-bound tests 30-50x slower on a shared 2-core machine.
torch.set_num_threads(1)

# Load difftest's pytest plugin even when the package is not installed (e.g. a bare checkout);
# when it is installed, its pytest11 entry point loads it and naming it again would register
# it twice.
if not any(
    ep.value == "difftest.interfaces.pytest_plugin.hooks"
    for ep in importlib.metadata.entry_points(group="pytest11")
):
    pytest_plugins = ["difftest.interfaces.pytest_plugin.hooks"]

settings.register_profile(
    "difftest-tests",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("difftest-tests")
