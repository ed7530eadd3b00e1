"""A worker given a share of the GPU's memory keeps to it (what several workers sharing one
device are given: :func:`difftest.execution.isolation.early.pool_memory_share`), and a case
too large for that share is a one-line error, not an internal one."""

from __future__ import annotations

import pytest
import torch

from difftest.execution.isolation import DeviceMemoryError, IsolatedExecutor
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.model.outcome import Outcome
from difftest.paths import resolve

ATTENTION = AttentionConfig(num_qo_heads=8, num_kv_heads=8, head_dim=128, page_size=64)
GIB = 1 << 30


def _case(prefix: int, requests: int) -> Case:
    batch = BatchSpec(mode="target_verify", prefix_lens=(prefix,) * requests, q_len=4)
    return Case(attention=ATTENTION, batch=batch, seed=3)


def test_a_worker_keeps_to_its_share_of_the_device() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    share = 2 * GIB / total  # two GiB of the device
    small, large = _case(300, 4), _case(60_000, 32)
    assert small.estimated_bytes() < GIB // 4
    assert large.pool_elements() * 2 > 7 * GIB  # its bf16 pool alone: 7.3 GiB
    paths = resolve(["torch-sdpa"])
    with IsolatedExecutor(paths, "cuda", memory_share=share) as executor:
        got = executor.evaluate(small)
        assert [r.outcome for r in got.results] == [Outcome.AGREE]
        with pytest.raises(DeviceMemoryError) as raised:
            executor.evaluate(large)
        assert large.digest() in str(raised.value) and "\n" not in str(raised.value)
        again = executor.evaluate(small)  # the worker gave its memory back and goes on
    assert [r.outcome for r in again.results] == [Outcome.AGREE]
    assert [r.metrics for r in again.results] == [r.metrics for r in got.results]
    # a worker without a share runs the large case
    with IsolatedExecutor(paths, "cuda") as executor:
        assert [r.outcome for r in executor.evaluate(large).results] == [Outcome.AGREE]


def test_in_a_campaigns_session_a_case_too_large_for_the_share_is_not_run() -> None:
    """What ``difftest run`` does with a case too large for its worker's share: ``UNSUPPORTED``
    on every path with the reason, and the worker goes on."""
    from difftest.machine.memory import unfitted_reason

    total = torch.cuda.get_device_properties(0).total_memory
    small, large = _case(300, 4), _case(60_000, 32)
    paths = resolve(["torch-sdpa"])
    with IsolatedExecutor(
        paths, "cuda", memory_share=2 * GIB / total, skip_unfitting=True
    ) as executor:
        got = executor.evaluate(large)
        again = executor.evaluate(small)
    assert [(r.outcome, r.reason) for r in got.results] == [
        (Outcome.UNSUPPORTED, unfitted_reason(executor.device))
    ]
    assert [r.outcome for r in again.results] == [Outcome.AGREE]
