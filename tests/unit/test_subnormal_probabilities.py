"""A float32 kernel may flush subnormal probabilities to zero, and the noise floor allows it.

When a sink outweighs every key of a row by more than ~87.3 logits, each probability
``exp(s - m)`` is below float32's smallest normal (2^-126). The float64 oracle keeps those
probabilities and gives an output of ~1e-37; a float32 kernel that flushes subnormals (CUDA's
``ex2.approx.ftz``, ``-ftz=true``; PyTorch's CPU SDPA on a case below) writes 0. XQA on flashinfer
0.7.4 did that on one request of a 10,427-case H200 campaign (``tests/data/
xqa-subnormal-row.repro.json``: request 131, max |err| 3.07e-38 against a bound of 4.95e-40).
The float32 roundings of the oracle, which set the noise floor, now flush such probabilities
too, so that output is within its bound; an error of a normal size on such a row still is not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import oracle_outputs
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.outcome import Outcome
from difftest.paths.registry import KernelPath, Precision, get_path

CPU = torch.device("cpu")
TINY = torch.finfo(torch.float32).tiny
CAMPAIGN_REPRO = Path(__file__).parents[1] / "data" / "xqa-subnormal-row.repro.json"

# One request, every logit ~0 (sm_scale 1e-6) and a sink of ~89.1 (the sink is drawn from
# the seed and scaled by the value scale squared): each probability is e^-89.1, about 2e-39.
SINK_CASE = {
    "format": "difftest-case/1",
    "attention": {
        "num_qo_heads": 1,
        "num_kv_heads": 1,
        "head_dim": 16,
        "page_size": 16,
        "q_dtype": "bf16",
        "kv_dtype": "bf16",
        "out_dtype": "bf16",
        "window_left": -1,
        "sinks": True,
        "sm_scale": 1e-6,
        "q_scale": 1.0,
        "k_scale": 1.0,
        "v_scale": 1.0,
        "o_scale": 1.0,
    },
    "batch": {
        "mode": "target_verify",
        "prefix_lens": [30],
        "q_len": 2,
        "draft": {"kind": "causal"},
        "padding_requests": 0,
        "padding_rows": 0,
    },
    "pool": {
        "kv_storage": "hnd",
        "page_order": "sequential",
        "spare_pages": 0,
        "shared_prefix_pages": 0,
        "table_width": "exact",
        "table_fill": "zero",
        "stale_fill": "zeros",
        "context_len": None,
    },
    "values": {"family": "randn", "scale": 4.36},
    "convention": "plain",
    "seed": 15,
}


def _explicit_float32(flush: bool, add: float = 0.0, flush_outputs: bool = False) -> KernelPath:
    """A float32 kernel written out: scores, max, exp (subnormals flushed when ``flush``),
    P @ V over the sum (subnormal outputs flushed when ``flush_outputs``); ``add`` is added to
    every output (a planted error)."""

    def run(batch: Batch) -> torch.Tensor:
        a = batch.case.attention
        rows = batch.q.shape[0]
        out = torch.empty(rows, a.num_qo_heads, a.head_dim)
        ps = a.page_size
        first = 0
        for b, seq in enumerate(batch.seq_lens.tolist()):
            L = batch.case.batch.new_tokens()[b]
            tok = torch.arange(seq)
            pages = batch.block_tables[b, tok // ps].long()
            k = batch.k_pages[pages, :, tok % ps].float()  # [T, H_kv, D]
            v = batch.v_pages[pages, :, tok % ps].float()
            for r in range(L):
                q = batch.q[first + r].float()  # [H_q, D]
                seen = seq - L + r + 1
                heads = torch.arange(a.num_qo_heads) // a.group_size
                s = torch.einsum("hd,thd->ht", q, k[:seen, heads]) * batch.bmm1_scale
                m = s.amax(dim=1)
                if batch.sinks is not None:
                    m = torch.maximum(m, batch.sinks.float())
                p = torch.exp(s - m[:, None])
                if flush:
                    p = torch.where(p < TINY, 0.0, p)
                denom = p.sum(dim=1)
                if batch.sinks is not None:
                    denom = denom + torch.exp(batch.sinks.float() - m)
                o = torch.einsum("ht,thd->hd", p, v[:seen, heads]) / denom[:, None]
                o = o * batch.bmm2_scale
                if flush_outputs:
                    o = torch.where(o.abs() < TINY, 0.0, o)
                out[first + r] = o + add
            first += L
        return out.to(batch.out_dtype)

    name = f"explicit-f32{'-ftz' if flush else ''}{'-out' if flush_outputs else ''}"
    name += "-planted" if add else ""
    fp32 = Precision(p_dtype="fp32")
    return KernelPath(name=name, run=run, side="reference", precision=lambda case: fp32)


def _outcomes(case: Case, paths: list[KernelPath]) -> dict[str, Outcome]:
    result = evaluate(case, paths, CPU)
    return {r.path: r.outcome for r in result.results}


def test_every_probability_of_the_row_is_subnormal_in_float32() -> None:
    batch = materialize(Case.from_json(SINK_CASE), CPU)
    assert 88.0 < float(batch.sinks[0]) < 90.0  # e^-88 = 6e-39 < 2^-126 = 1.2e-38
    ref, low = oracle_outputs(batch, [Precision(p_dtype="fp32")])
    assert float(ref.abs().max()) > TINY  # the exact output is a normal float32
    (flushed,) = low.values()
    assert float(flushed.abs().max()) == 0.0  # the float32 rounding drops every probability


def test_a_kernel_that_flushes_subnormal_probabilities_agrees() -> None:
    case = Case.from_json(SINK_CASE)
    got = _outcomes(case, [_explicit_float32(flush=True), _explicit_float32(flush=False)])
    assert got == {"explicit-f32-ftz": Outcome.AGREE, "explicit-f32": Outcome.AGREE}


def test_the_cpu_paths_agree_on_the_row() -> None:
    # PyTorch's CPU SDPA writes 0 on this row on the machines seen (its exp flushes): WRONG
    # before the floor allowed the flush. Either way it must agree.
    case = Case.from_json(SINK_CASE)
    got = _outcomes(case, [get_path("torch-sdpa"), get_path("torch-paged-online")])
    assert got == {"torch-sdpa": Outcome.AGREE, "torch-paged-online": Outcome.AGREE}


@pytest.mark.parametrize("add", [1e-30, 1e-3])
def test_an_error_of_a_normal_size_on_the_row_is_still_wrong(add: float) -> None:
    case = Case.from_json(SINK_CASE)
    got = _outcomes(case, [_explicit_float32(flush=True, add=add)])
    assert got == {"explicit-f32-ftz-planted": Outcome.WRONG}


def test_the_campaigns_case_is_a_flushed_row() -> None:
    """The H200 campaign's case (177 requests; request 131's rows are all ~1e-38 or less):
    the flushing float32 kernel agrees now and gives XQA's error on that request, and a
    planted error of 1e-3 there is wrong."""
    case = Case.from_json(json.loads(CAMPAIGN_REPRO.read_text())["case"])
    batch = materialize(case, CPU)
    ref, _ = oracle_outputs(batch, [])
    L = case.batch.q_len
    assert float(ref[131 * L : 132 * L].abs().max()) == pytest.approx(3.0714668386945e-38)
    flushing = _explicit_float32(flush=True)
    out = flushing.run(batch)
    assert float(out[131 * L : 132 * L].abs().max()) == 0.0  # as XQA wrote it
    result = evaluate(case, [flushing, _explicit_float32(flush=True, add=1e-3)], CPU)
    assert [r.outcome for r in result.results] == [Outcome.AGREE, Outcome.WRONG]


OUTPUT_REPRO = Path(__file__).parents[1] / "data" / "xqa-subnormal-output.repro.json"


def test_a_kernel_that_flushes_subnormal_outputs_agrees() -> None:
    """The same campaign rerun on the H200 (Run 19: 0.7.4, seed 16, case 7021 again, another
    draw of the template): request 52's row 0 is ~3e-37 with one element of -7.7085e-39,
    below 2^-126, which XQA wrote as 0 (its error there, 7.71e-39, is that element; the bound
    was 4.45e-39). A float32 kernel that flushes its subnormal outputs writes the same; the
    float32 precision of the floor flushes them too now, so it agrees, and an error of a
    normal size there is still wrong."""
    case = Case.from_json(json.loads(OUTPUT_REPRO.read_text())["case"])
    batch = materialize(case, CPU)
    ref, _ = oracle_outputs(batch, [])
    L = case.batch.q_len
    row = ref[52 * L, 0]
    assert float(row.abs().max()) == pytest.approx(3.4093e-37, rel=1e-4)
    assert float(row[13]) == pytest.approx(-7.7085e-39, rel=1e-4)
    flushing = _explicit_float32(flush=True, flush_outputs=True)
    out = flushing.run(batch)
    assert float(out[52 * L, 0, 13]) == 0.0  # as XQA wrote it
    err = float((out[52 * L : 53 * L].double() - ref[52 * L : 53 * L]).abs().max())
    assert err == pytest.approx(7.7085e-39, rel=1e-4)  # XQA's error on the H200
    planted = _explicit_float32(flush=True, flush_outputs=True, add=1e-30)
    result = evaluate(case, [flushing, _explicit_float32(flush=True), planted], CPU)
    assert [r.outcome for r in result.results] == [Outcome.AGREE, Outcome.AGREE, Outcome.WRONG]
