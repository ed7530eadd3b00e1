"""Verdicts on cases that set ``skip_softmax_threshold_scale_factor``.

A path that honours the factor may leave out KV tiles, which moves its output by at most the
skip allowance (:func:`difftest.oracle.skip_softmax.skip_allowance`): it is held to the exact
tolerance plus that allowance, and its metrics say how much room it took. A path that ignores
the factor must match exact attention; when it does, the verdict is ``IGNORES`` and names the
argument, so whoever set it learns that it had no effect.
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.model.batch import Batch
from difftest.model.outcome import Outcome, PathResult
from difftest.oracle.attention import attention_terms
from difftest.oracle.skip_softmax import skip_allowance

ARGUMENT = "skip_softmax_threshold_scale_factor"


def factor_of(batch: Batch) -> float | None:
    return batch.case.attention.skip_softmax_threshold_scale_factor


def allowance(batch: Batch) -> torch.Tensor:
    """``[bs]``: the most the case's factor lets skipping move each request's output."""
    factor = factor_of(batch)
    if factor is None:
        return torch.zeros(batch.batch_size, dtype=torch.float64, device=batch.device)
    terms = attention_terms(
        batch.q,
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.q_len,
        bmm1_scale=batch.bmm1_scale,
        window_left=batch.window_left,
        draft_mask=None if batch.is_chain_draft else batch.draft_mask,
        q_lens=batch.new_tokens() if batch.is_ragged else None,
    )
    return skip_allowance(terms, factor, batch.bmm2_scale, batch.sinks is not None)


def honoured(
    verdict: PathResult,
    batch: Batch,
    out: torch.Tensor,
    ref: torch.Tensor,
    exact_bound: torch.Tensor,
    extra: torch.Tensor,
) -> PathResult:
    """``verdict`` (judged against ``exact_bound + extra``) with the allowance and how many
    elements needed it in its metrics."""
    row_request = batch.row_requests()
    err = (out.double() - ref).abs()
    past = err > exact_bound[row_request].view(-1, 1, 1)
    metrics = dataclasses.replace(
        verdict.metrics, skip_allowance=float(extra.max()), beyond_exact=int(past.sum())
    )
    return dataclasses.replace(verdict, metrics=metrics)


def ignored(verdict: PathResult, batch: Batch) -> PathResult:
    """An exact-attention verdict on a case with the factor set: ``IGNORES`` when it agrees."""
    if verdict.outcome is not Outcome.AGREE:
        return verdict
    return dataclasses.replace(
        verdict,
        outcome=Outcome.IGNORES,
        detail=ARGUMENT,
        reason=f"{ARGUMENT}={factor_of(batch):g} had no effect: {verdict.path} does not apply "
        "it (its output is exact attention, within the exact tolerance)",
    )
