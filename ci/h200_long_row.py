"""One wrong row of a repro, looked at closely: the path's output beside the oracle, the noise
floor's model and correct kernels written out (docs/validation.md, Runs 23 and 24).

    python ci/h200_long_row.py REPRO [--path NAME] [--request B --row R --head H] [--fp8]

Runs ``--path`` (default: the repro's) on the repro's case and prints, for the row and head of
its first located error (or those given): the largest errors by dimension with the output,
the oracle and the floor's model there; the oracle's row against an independent float64
computation of it (the row's keys gathered from the pages, a plain softmax, times V); the
least-squares scale of the output against the oracle on that row (a normalisation error
shows as a scale, a wrong key as a pattern); and the error on that row of float32 kernels
that round q and the probabilities as the path's precision says (fp8 e4m3 with ``--fp8``,
bf16 or fp16 otherwise) in the ways a correct kernel may (one maximum
per row; online softmax in tiles of 16-256 keys; the row split into 2-128 parts merged at the
end; the row sum over the rounded or the unrounded terms), and for an fp8 precision the model
of XQA's SM90 fp8 kernel (its CTA split for the case's request count, a 14-bit accumulator;
docs/validation.md Run 39). With ``--requests N,...`` it instead runs the case again with its
request list cut, or lengthened by requests with the shortest prefix the case allows (none, or
its shared prefix pages), at its end to N requests, the
located row's keys and values unchanged (checked), and prints for each N XQA's CTA split, the
path's error on that row and the model's: XQA reads no setting of its split on its FlashInfer
entry point (``XQA_NB_SUB_SEQ`` is read only by TRT-LLM's own launcher), so the launch's
request count is the one way to set it. Writes ``long_row.json`` (``long_row_sweep.json``)
and the
row's tensors (``long_row.pt``) to
DIFFTEST_GPU_OUT (default difftest-out/gpu). Without a GPU it runs what it can on the CPU
(the emulations and the oracle; a FlashInfer path is then unavailable).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
from pathlib import Path

import torch

from difftest.generation.materialize import materialize
from difftest.judgement.tolerance import Tolerance, floor_of, oracle_outputs, request_bounds
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths.registry import Precision, get_path
from difftest.records.repro import load_repro

FP8 = torch.float8_e4m3fn
P_DTYPES = {"fp8_e4m3": FP8, "bf16": torch.bfloat16, "fp16": torch.float16}
"""A precision's probability dtype as torch's (none: float32, no rounding)."""


def row_keys(batch: Batch, request: int, row: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (float32, ``[T, D]``) that ``row`` of ``request`` sees for query ``head``
    (a causal draft: the prefix and the draft tokens up to its own)."""
    a, L = batch.case.attention, batch.case.batch.q_len
    seq, ps = int(batch.seq_lens[request]), a.page_size
    seen = seq - L + row + 1
    tok = torch.arange(seen, device=batch.k_pages.device)
    pages = batch.block_tables[request, tok // ps].long()
    kv_head = head // a.group_size
    k = batch.k_pages[pages, kv_head, tok % ps].float()
    v = batch.v_pages[pages, kv_head, tok % ps].float()
    return k, v


def fp8_kernel(
    s: torch.Tensor,
    v: torch.Tensor,
    tile: int,
    parts: int,
    rounded_sum: bool,
    p_dtype: torch.dtype = FP8,
) -> torch.Tensor:
    """A float32 softmax(s) @ v that rounds each ``exp(s - m)`` to ``p_dtype`` (fp8 e4m3 by
    default, or bf16 or fp16) against the running maximum ``m`` of its part: ``parts``
    contiguous parts, each an online pass in tiles of ``tile`` keys, merged at the end; the
    row sum over the rounded terms or the exact ones."""
    edges = torch.linspace(0, s.numel(), parts + 1).round().long().tolist()
    pieces = []
    for lo, hi in itertools.pairwise(edges):
        m = torch.tensor(float("-inf"), device=s.device)
        total = torch.zeros((), device=s.device)
        acc = torch.zeros(v.shape[1], device=s.device)
        for t0 in range(lo, hi, tile):
            st = s[t0 : min(hi, t0 + tile)]
            new = torch.maximum(m, st.max())
            keep = torch.exp(m - new) if torch.isfinite(m) else torch.zeros((), device=s.device)
            e = torch.exp(st - new)
            p = e.to(p_dtype).float()
            acc = acc * keep + p @ v[t0 : min(hi, t0 + tile)]
            total = total * keep + (p.sum() if rounded_sum else e.sum())
            m = new
        pieces.append((m, total, acc))
    top = torch.stack([p[0] for p in pieces]).max()
    num = sum(torch.exp(p[0] - top) * p[2] for p in pieces)
    den = sum(torch.exp(p[0] - top) * p[1] for p in pieces)
    return num / den


XQA_TILE = 64
"""Keys of one tile of XQA's SM90 kernel (``gemm0CtaTileNbTokens`` in flashinfer 0.7.4's
``csrc/xqa/mha_sm90.cu``)."""


def xqa_sub_seqs(batch: int, seq_len: int, kv_heads: int = 1, sms: int = 132) -> int:
    """How many CTAs XQA's SM90 kernel splits one (request, KV head)'s keys between: its launch's
    ``nbSubSeqPerSeq`` (flashinfer 0.7.4, ``mha_sm90.cu``: ``round(sms * 3 / (batch * kv_heads)
    * 0.25)`` with the division in integers, at least 1, at most one per 64-key tile), ``batch``
    the launch's requests (padding included) and ``sms`` the device's (132 on an H100 SXM and
    an H200). A packed launch has more requests, so fewer CTAs a request and more keys each."""
    # C's round() takes halves away from zero (Python's round() to even): 2.5 -> 3
    split = max(1, math.floor((sms * 3 // (batch * kv_heads)) * 0.25 + 0.5))
    return min(split, -(-seq_len // XQA_TILE))


def _cut(x: torch.Tensor, ulp: torch.Tensor) -> torch.Tensor:
    return torch.trunc(x / ulp) * ulp


def narrow_sum(acc: torch.Tensor, terms: torch.Tensor, bits: int, k: int = 32) -> torch.Tensor:
    """``acc + terms.sum(0)`` the way a narrow accumulator adds: ``k`` terms at a time (one MMA
    instruction's reduction), each addend (the accumulator included) cut toward zero to the
    ``bits`` leading bits of the largest magnitude among them. A model of the limited
    accumulation precision of Hopper's fp8 tensor-core MMAs, which keep about 14 bits (as the
    DeepSeek-V3 report measured on H800 GPUs); float64 otherwise."""
    for i in range(0, terms.shape[0], k):
        group = terms[i : i + k]
        big = torch.maximum(acc.abs(), group.abs().amax(0))
        exp = torch.floor(torch.log2(torch.where(big > 0, big, torch.ones_like(big))))
        ulp = torch.pow(2.0, exp - bits + 1)
        acc = _cut(acc, ulp) + _cut(group, ulp).sum(0)
    return acc


def xqa_sm90_fp8_model(s: torch.Tensor, v: torch.Tensor, sub_seqs: int, bits: int) -> torch.Tensor:
    """One row of XQA's SM90 fp8 kernel as modelled here: CTA ``j`` of ``sub_seqs`` takes tiles
    ``j, j + sub_seqs, ...`` of :data:`XQA_TILE` keys, an online softmax over them with the
    probabilities rounded to fp8 e4m3 against its running maximum, their products with V
    summed by :func:`narrow_sum` (``bits``; 0: exactly), the row sum over the unrounded terms;
    the CTAs' parts merged exactly. Float64 otherwise; ``s`` the row's scores, ``v`` its
    values (``[T, D]``)."""
    tiles = [(t, min(s.numel(), t + XQA_TILE)) for t in range(0, s.numel(), XQA_TILE)]
    parts = []
    for first in range(sub_seqs):
        m = torch.tensor(float("-inf"), dtype=torch.float64)
        total = torch.zeros((), dtype=torch.float64)
        acc = torch.zeros(v.shape[1], dtype=torch.float64)
        for lo, hi in tiles[first::sub_seqs]:
            st = s[lo:hi].double()
            new = torch.maximum(m, st.max())
            keep = torch.exp(m - new) if torch.isfinite(m) else torch.zeros((), dtype=torch.float64)
            e = torch.exp(st - new)
            p = e.float().to(FP8).double()
            terms = p[:, None] * v[lo:hi].double()
            acc = narrow_sum(acc * keep, terms, bits) if bits else acc * keep + terms.sum(0)
            total = total * keep + e.sum()
            m = new
        parts.append((m, total, acc))
    top = torch.stack([p[0] for p in parts]).max()
    num = sum(torch.exp(p[0] - top) * p[2] for p in parts)
    den = sum(torch.exp(p[0] - top) * p[1] for p in parts)
    assert isinstance(num, torch.Tensor) and isinstance(den, torch.Tensor)
    return num / den


def with_requests(case: Case, n: int) -> Case:
    """``case`` with ``n`` requests, its padding requests counted: its list of real requests
    cut, or lengthened at its end by requests with the shortest prefix the case allows (none,
    or its shared prefix pages: every real request holds those), the earlier requests' keys
    unchanged (checked by :func:`sweep_requests`)."""
    lens = case.batch.prefix_lens
    real = n - case.batch.padding_requests
    if real < 1:
        raise SystemExit(f"--requests {n}: the case has {case.batch.padding_requests} padding")
    shortest = case.pool.shared_prefix_pages * case.attention.page_size
    lens = lens[:real] if real <= len(lens) else lens + (shortest,) * (real - len(lens))
    return dataclasses.replace(case, batch=dataclasses.replace(case.batch, prefix_lens=lens))


def sweep_requests(
    case: Case, counts: list[int], request: int, row: int, head: int, name: str, bits: int = 14
) -> list[dict[str, object]]:
    """For each count in ``counts``: ``case`` with that many requests (:func:`with_requests`),
    the path's error on (``request``, ``row``, ``head``) and the XQA SM90 fp8 model's at the
    split that count gives; the row's keys and values checked equal to the first count's."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    path = get_path(name)
    rows: list[dict[str, object]] = []
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    for n in counts:
        if n <= request:
            raise SystemExit(f"--requests {n}: the located request is {request}")
        c = with_requests(case, n)
        batch = materialize(c, device)
        L = c.batch.q_len
        g = request * L + row
        ref, _ = oracle_outputs(batch, ())
        k, v = row_keys(batch, request, row, head)
        if first is None:
            first = (k, v)
        same = bool(torch.equal(first[0], k) and torch.equal(first[1], v))
        q = batch.q[g, head].float().to(FP8).float()
        s = (k @ q) * batch.bmm1_scale
        split = xqa_sub_seqs(c.batch.num_requests, s.numel(), c.attention.num_kv_heads)
        r = ref[g, head]

        def err(o: torch.Tensor, batch: Batch = batch, r: torch.Tensor = r) -> float:
            scaled = (o.double() * batch.bmm2_scale).to(batch.out_dtype).double()
            return float((scaled - r.cpu()).abs().max())

        entry: dict[str, object] = {
            "requests": c.batch.num_requests,
            "ctas_a_row": split,
            "keys_a_cta": -(-s.numel() // split),
            "row_keys_as_first": same,
            f"model_{bits}_bits": err(xqa_sm90_fp8_model(s.cpu(), v.cpu(), split, bits)),
        }
        reason = path.availability(device)
        if reason is None:
            with torch.inference_mode():
                out = path.run(batch)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            entry["path"] = float((out[g, head].double() - r).abs().max())
        else:
            entry["path_unavailable"] = reason
        rows.append(entry)
        print(json.dumps(entry))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repro")
    ap.add_argument("--path", default=None)
    ap.add_argument("--request", type=int, default=None)
    ap.add_argument("--row", type=int, default=None)
    ap.add_argument("--head", type=int, default=None)
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="model q and P rounded to fp8 whatever the path declares on this device (off a "
        "GPU, XQA declares its generic kernel's rounding)",
    )
    ap.add_argument(
        "--requests",
        default=None,
        help="comma-separated request counts: run the case at each (see the module's text)",
    )
    args = ap.parse_args()
    repro = load_repro(args.repro)
    recorded = repro.path_result()
    errors = recorded.metrics.errors if recorded is not None else ()
    if not errors and None in (args.request, args.row, args.head):
        raise SystemExit("the repro locates no error: give --request, --row and --head")
    request = args.request if args.request is not None else errors[0].request
    row = args.row if args.row is not None else errors[0].rows[0]
    head = args.head if args.head is not None else errors[0].heads[0]
    name = args.path or (repro.finding.path if repro.finding else "fi-decode-xqa")
    folder = Path(os.environ.get("DIFFTEST_GPU_OUT", "difftest-out/gpu"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.requests:
        counts = [int(x) for x in args.requests.split(",")]
        rows = sweep_requests(repro.case, counts, request, row, head, name)
        sweep = {"repro": str(args.repro), "path": name, "located": [request, row, head]}
        (folder / "long_row_sweep.json").write_text(
            json.dumps({**sweep, "rows": rows}, indent=1) + "\n"
        )
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = materialize(repro.case, device)
    L = repro.case.batch.q_len
    g = request * L + row
    path = get_path(name)
    fp8 = (
        Precision(p_dtype="fp8_e4m3", q_dtype="fp8_e4m3")
        if args.fp8
        else path.precision(repro.case)
    )
    ref, lows = oracle_outputs(batch, (fp8,))
    floor = floor_of(lows[fp8], ref, batch)
    bound = request_bounds(batch, ref, floor, Tolerance())
    result: dict[str, object] = {
        "repro": str(args.repro),
        "path": name,
        "request": request,
        "row": row,
        "head": head,
        "device": str(device),
        "precision": {"p": fp8.p_dtype, "q": fp8.q_dtype},
        "floor": float(floor[request]),
        "bound": float(bound[request]),
    }
    r = ref[g, head]
    low = lows[fp8][g, head]
    out = None
    reason = path.availability(device)
    if reason is None:
        with torch.inference_mode():
            out = path.run(batch).double()[g, head]
            torch.cuda.synchronize() if device.type == "cuda" else None
    else:
        result["path_unavailable"] = reason
    k, v = row_keys(batch, request, row, head)
    q = batch.q[g, head].float()
    qr = q.to(FP8).float() if fp8.q_dtype == "fp8_e4m3" else q
    s = (k @ qr) * batch.bmm1_scale
    result["keys_seen"] = int(s.numel())
    # the oracle's row checked by an independent float64 computation: the row's keys gathered
    # from the pages (row_keys), a plain softmax, times V
    p64 = torch.softmax((k.double() @ q.double()) * batch.bmm1_scale, dim=0)
    own = (p64 @ v.double()) * batch.bmm2_scale
    result["independent_row_vs_oracle"] = float((own - r).abs().max())
    result["score_range"] = [float(s.min()), float(s.max())]

    def err(o: torch.Tensor) -> float:
        return float(((o.double() * batch.bmm2_scale).to(batch.out_dtype).double() - r).abs().max())

    pd = P_DTYPES.get(fp8.p_dtype or "", torch.float32)
    models = {f"floor (oracle's {fp8.p_dtype} model)": float((low - r).abs().max())}
    for rounded in (False, True):
        tag = "rounded sum" if rounded else "exact sum"
        models[f"one maximum, {tag}"] = err(fp8_kernel(s, v, s.numel(), 1, rounded, pd))
        for tile in (16, 32, 64, 128, 256):
            models[f"online, tile {tile}, {tag}"] = err(fp8_kernel(s, v, tile, 1, rounded, pd))
        for parts in (2, 4, 8, 16, 32, 64, 128):
            models[f"{parts} parts, tile 64, {tag}"] = err(fp8_kernel(s, v, 64, parts, rounded, pd))
    result["models_max_err"] = models
    if pd == FP8:  # XQA's SM90 fp8 kernel as modelled (Run 39): this case's split, 14 bits
        requests = repro.case.batch.num_requests
        heads = repro.case.attention.num_kv_heads
        split = xqa_sub_seqs(requests, s.numel(), heads)
        result["xqa_sm90_fp8_model"] = {
            "requests": requests,
            "ctas_a_row": split,
            "max_err_14_bits": err(xqa_sm90_fp8_model(s.cpu(), v.cpu(), split, 14)),
            "max_err_exact_sums": err(xqa_sm90_fp8_model(s.cpu(), v.cpu(), split, 0)),
        }
    if out is not None:
        e = (out - r).abs()
        worst = torch.argsort(e, descending=True)[:8].tolist()
        result["path_max_err"] = float(e.max())
        result["worst_dims"] = [
            {"dim": d, "out": float(out[d]), "oracle": float(r[d]), "floor_model": float(low[d])}
            for d in worst
        ]
        result["scale_vs_oracle"] = float((out @ r) / (r @ r))
        result["error_norm_share_of_scale"] = float(
            (out - r * result["scale_vs_oracle"]).norm() / max(float((out - r).norm()), 1e-30)
        )
    (folder / "long_row.json").write_text(json.dumps(result, indent=1) + "\n")
    tensors = {"oracle": r.cpu(), "floor_model": low.cpu(), "scores": s.cpu()}
    if out is not None:
        tensors["out"] = out.cpu()
    torch.save(tensors, folder / "long_row.pt")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
