"""Shared test settings: a fast, deterministic Hypothesis profile."""

from __future__ import annotations

import importlib.metadata

import torch
from hypothesis import HealthCheck, settings

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
