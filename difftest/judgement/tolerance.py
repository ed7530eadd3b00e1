"""Comparison: a tolerance grounded in a measured noise floor, judged per request.

For each case and each precision a path declares, the oracle is run a second time the way a
correct kernel at that precision computes (float32 arithmetic, probabilities rounded to the
declared dtype, q rounded as the path rounds it, output rounded to the output dtype). Its
distance from the float64 oracle, per request, is the *noise floor*: the error a correct
kernel makes. A path passes a request when every element is within

    bound_b = rtol * floor_b + atol_ulps * ulp(out_dtype, max |ref_b|)

(FlashAttention's tests use the same shape of bound with ``rtol = 2``). Each request is judged
on its own; there is no global matched ratio that could hide one wrong request.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from difftest.machine import host_copy
from difftest.model.batch import DTYPES, Batch
from difftest.model.errors import FormatError, InvalidCase
from difftest.model.outcome import ErrorLocation, Metrics, Outcome, PairAgreement, PathResult
from difftest.model.strict_json import Reader
from difftest.oracle.batched import HostLens, Rounding, batched_paged_attention
from difftest.paths.registry import Precision

_P_DTYPES: dict[str, torch.dtype | None] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp32": None,
}
MAX_LOCATED_REQUESTS = 16
"""How many wrong requests a verdict locates in detail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """The verdict's rules. The tool's own (the defaults) decide every verdict; one read from
    a repro file is shown for comparison and used only when the user asks for it."""

    rtol: float = 2.0
    """Multiple of the measured noise floor a path may reach."""
    atol_ulps: float = 2.0
    """Output-dtype ulps at the request's largest reference magnitude, always allowed."""

    def __post_init__(self) -> None:
        for name, top in (("rtol", MAX_RTOL), ("atol_ulps", MAX_ATOL_ULPS)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidCase(f"tolerance.{name}", value, "must be a number")
            if not (math.isfinite(value) and 0 <= value <= top):
                raise InvalidCase(f"tolerance.{name}", value, f"must be finite, in [0, {top:g}]")

    def to_json(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol_ulps": self.atol_ulps}

    @classmethod
    def from_json(cls, r: Reader) -> Tolerance:
        r.only("rtol", "atol_ulps")
        try:
            return cls(
                rtol=r.number("rtol", 2.0, finite=False) or 0.0,
                atol_ulps=r.number("atol_ulps", 2.0, finite=False) or 0.0,
            )
        except InvalidCase as e:
            raise FormatError(r.source, str(e)) from None


MAX_RTOL = 16.0
"""The largest noise-floor multiple a tolerance may have: a kernel this far from a correct
computation at its own precision is wrong, whatever a file says."""
MAX_ATOL_ULPS = 64.0
"""The largest absolute allowance, in output-dtype ulps."""


Attention = Callable[..., list[torch.Tensor]]
"""How a launch's roundings are computed: :func:`~difftest.oracle.batched.batched_paged_attention`
(the torch form, the default: what `difftest export` copies into a script) or a function with
its arguments and results (:func:`difftest.oracle.fused.batched_attention`, which the
execution layer passes on a GPU)."""


def reference(batch: Batch, attention: Attention = batched_paged_attention) -> torch.Tensor:
    """The float64 oracle's output ``[R, H_q, D]`` for ``batch``."""
    ref, _ = oracle_outputs(batch, (), attention)
    return ref


def _low_q(q: torch.Tensor, q_dtype: str | None) -> torch.Tensor:
    """The queries ``q`` as a kernel that rounds them to ``q_dtype`` reads them."""
    if q_dtype is None:
        return q
    return (q.double() * 1.0).to(DTYPES[q_dtype])


def oracle_outputs(
    batch: Batch, precisions: Iterable[Precision], attention: Attention = batched_paged_attention
) -> tuple[torch.Tensor, dict[Precision, torch.Tensor]]:
    """The float64 oracle's output, and for each precision the output a correct kernel at that
    precision computes (float32 arithmetic, its q and probability rounding, rounded to the
    output dtype; as float64). One batched pass over every request of ``batch``
    (:mod:`difftest.oracle.batched`): one gather of the K/V serves them all."""
    ref, lows = _oracle(batch, precisions, attention, reference=True)
    assert ref is not None
    return ref, lows


def low_outputs(
    batch: Batch, precisions: Iterable[Precision], attention: Attention = batched_paged_attention
) -> dict[Precision, torch.Tensor]:
    """:func:`oracle_outputs`' low-precision outputs alone (the same bits, given the same
    ``attention``), for a caller that has the float64 output already and finds it needs the
    noise floors after all."""
    return _oracle(batch, precisions, attention, reference=False)[1]


def _oracle(
    batch: Batch, precisions: Iterable[Precision], attention: Attention, *, reference: bool
) -> tuple[torch.Tensor | None, dict[Precision, torch.Tensor]]:
    wanted = list(dict.fromkeys(precisions))
    # One tensor per query rounding: roundings that read the same tensor share their scores
    # and probabilities in the oracle (``batch.q`` is a new view at each read).
    q = batch.q
    low_q = {dtype: _low_q(q, dtype) for dtype in dict.fromkeys(p.q_dtype for p in wanted)}
    roundings = [Rounding(q)] if reference else []
    roundings += [Rounding(low_q[p.q_dtype], torch.float32, _P_DTYPES[p.p_dtype]) for p in wanted]
    outs = attention(
        batch.k_pages,
        batch.v_pages,
        batch.block_tables,
        batch.seq_lens,
        batch.new_tokens() if batch.is_ragged else batch.q_len,
        roundings,
        bmm1_scale=batch.bmm1_scale,
        bmm2_scale=batch.bmm2_scale,
        window_left=batch.window_left,
        sinks=batch.sinks,
        draft_mask=None if batch.is_chain_draft else batch.draft_mask,
        host_lens=HostLens(t=batch.case.batch.seq_lens(), l=batch.case.batch.new_tokens()),
    )
    ref = outs.pop(0) if reference else None
    rounded = {p: low.to(batch.out_dtype).double() for p, low in zip(wanted, outs, strict=True)}
    return ref, rounded


def per_request_max(x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[bs]`` maximum of ``|x|`` (``x [R, H, D]``) over each request's rows (NaN counts as
    inf; a request of a ragged batch has its own number of rows)."""
    return _rows_max(x, batch.batch_size, batch.row_requests() if batch.is_ragged else None)


def _rows_max(x: torch.Tensor, bs: int, rows: torch.Tensor | None) -> torch.Tensor:
    """``[bs]`` maximum of ``|x|`` over each request's rows: ``rows`` gives the request of each
    row (``None``: ``R / bs`` consecutive rows each)."""
    x = torch.nan_to_num(x.abs().double(), nan=float("inf"))
    if rows is None:
        return x.reshape(bs, -1).amax(dim=1)
    per_row = x.reshape(x.shape[0], -1).amax(dim=1)
    out = torch.zeros(bs, dtype=per_row.dtype, device=per_row.device)
    return out.scatter_reduce(0, rows, per_row, "amax", include_self=True)


def noise_floor(
    batch: Batch,
    ref: torch.Tensor,
    precision: Precision,
    attention: Attention = batched_paged_attention,
) -> torch.Tensor:
    """``[bs]`` error a correct computation at ``precision`` makes against the oracle."""
    low = low_outputs(batch, (precision,), attention)
    return floor_of(low[precision], ref, batch)


def floor_of(low: torch.Tensor, ref: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[bs]`` noise floor: the largest distance per request of a correct low-precision
    output ``low`` (from :func:`oracle_outputs`) from the oracle's ``ref``."""
    return per_request_max(low - ref, batch)


def request_bounds(
    batch: Batch,
    ref: torch.Tensor,
    floor: torch.Tensor,
    tol: Tolerance,
    absolute: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[bs]`` the largest error each request may show (``absolute``: the
    :func:`absolute_allowance` of ``batch`` and ``ref`` when the caller has it already)."""
    if absolute is None:
        absolute = absolute_allowance(batch, ref, tol)
    return tol.rtol * floor + absolute


def absolute_allowance(batch: Batch, ref: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """``[bs]`` the part of :func:`request_bounds` that is not the noise floor's: ``atol_ulps``
    output-dtype ulps at each request's largest reference magnitude (the same for every
    precision, so a caller bounding several precisions computes it once)."""
    peak = per_request_max(ref, batch).clamp_min(torch.finfo(torch.float32).tiny)
    ulp = torch.finfo(batch.out_dtype).eps * torch.exp2(torch.floor(torch.log2(peak)))
    return tol.atol_ulps * ulp


def judge(
    path: str,
    batch: Batch,
    out: torch.Tensor,
    ref: torch.Tensor,
    bound: torch.Tensor,
    within: torch.Tensor | None = None,
) -> PathResult:
    """Compare one path's output with the oracle, request by request. ``within`` ``[bs]``:
    the part of ``bound`` that holds whatever the noise floor (:func:`absolute_allowance`,
    plus any skip allowance); when every row is within it, the metrics' ``max_bound`` is its
    largest, so that a verdict's metrics are the same whether or not the floor was measured
    (see :mod:`difftest.execution.bounds`).

    When every output is written and finite (the common case, a wrong verdict by tolerance
    included) its figures are reduced on the device and read back at once, and a wrong
    verdict's locations once more (:func:`locate`); otherwise :func:`_judge_nonfinite`
    reads them one by one. Either gives what :func:`_judge_nonfinite` gives."""
    rows = ref.shape[0]
    if rows == 0:
        return _judge_nonfinite(path, batch, out, ref, bound, within)
    bs = batch.batch_size
    row_request = batch.row_requests()
    out64 = out.double()
    delta = out64 - ref
    err = delta.abs()
    row_err = err.reshape(rows, -1).amax(dim=1)  # NaN where a row has a NaN error
    row_bound = bound[row_request]
    bad_row = ~(row_err <= row_bound)
    bad = ~(err <= row_bound.view(-1, 1, 1))
    bad_requests = torch.zeros(bs, dtype=torch.int32, device=bad.device).index_add_(
        0, row_request, bad_row.to(torch.int32)
    )
    zero = row_err.new_zeros(())
    figures = (
        row_err.max(),  # the peak error: finite only if every output is
        (row_err <= within[row_request]).all() if within is not None else zero,
        bad_row.any(),
        (bad_requests > 0).sum(),
        bad.double().mean(),
        delta.norm() / ref.norm().clamp_min(1e-300),
        bound.max(),
        within.max() if within is not None else zero,
        (out64 * ref).sum(),
        (ref * ref).sum(),
    )
    host = torch.stack([f.to(torch.float64) for f in figures]).tolist()  # one read
    peak, all_within, any_bad, n_bad, mismatch, rel_l2, bound_max, within_max, dot, denom = host
    if not math.isfinite(peak):
        return _judge_nonfinite(path, batch, out, ref, bound, within)
    use_within = within is not None and bool(all_within)
    errors: tuple[ErrorLocation, ...] = ()
    if any_bad:
        errors = locate(bad, err, bound, row_request)
    else:
        n_bad, mismatch = 0, 0.0
    metrics = Metrics(
        max_abs=peak,
        rel_l2=rel_l2,
        mismatch_fraction=mismatch,
        nonfinite=0,
        unwritten_rows=0,
        max_bound=within_max if use_within else bound_max,
        scale_ratio=dot / denom if denom > 0 else None,
        errors=errors,
    )
    return _verdict(path, metrics, rows, bs, int(n_bad), 0, 0)


def _judge_nonfinite(
    path: str,
    batch: Batch,
    out: torch.Tensor,
    ref: torch.Tensor,
    bound: torch.Tensor,
    within: torch.Tensor | None = None,
) -> PathResult:
    """:func:`judge` for any output, NaN and infinite ones included: each figure read back
    on its own (a dozen waits for the device; reached only when some output is not finite,
    or there are no rows)."""
    bs = batch.batch_size
    rows = ref.shape[0]
    row_request = batch.row_requests()
    out64 = out.double()
    delta = out64 - ref
    err = delta.abs()
    row_err = err.reshape(rows, -1).amax(dim=1)
    peak = float(row_err.max()) if rows else float("nan")
    all_finite = math.isfinite(peak)
    finite: torch.Tensor | None = None
    if all_finite:  # every output written and finite
        n_unwritten = n_nonfinite = 0
        diff = delta
        max_abs = peak
    else:
        finite = torch.isfinite(err)
        unwritten = torch.isnan(out64).reshape(rows, -1).all(dim=1)
        nonfinite = ~torch.isfinite(out64) & ~unwritten.view(-1, 1, 1)
        n_unwritten = int(unwritten.sum())
        n_nonfinite = int(nonfinite.sum())
        diff = torch.where(finite, delta, 0.0)
        any_finite = bool(finite.any())
        max_abs = float(torch.where(finite, err, 0.0).max()) if any_finite else float("nan")
    row_bound = bound[row_request]
    bad_row = ~(row_err <= row_bound)  # a row with an error over its bound, or a NaN one
    decided_by = bound
    if within is not None and bool((row_err <= within[row_request]).all()):
        decided_by = within
    n_bad, mismatch = 0, 0.0
    errors: tuple[ErrorLocation, ...] = ()
    if bool(bad_row.any()):
        bad = ~(err <= row_bound.view(-1, 1, 1))  # NaN errors count as bad
        bad_requests = torch.zeros(bs, dtype=torch.bool, device=bad.device)
        bad_requests[row_request[bad_row]] = True
        n_bad = int(bad_requests.sum())
        errors = locate(bad, err, bound, row_request)
        mismatch = float(bad.double().mean())
    metrics = Metrics(
        max_abs=max_abs,
        rel_l2=float(diff.norm() / ref.norm().clamp_min(1e-300)),
        mismatch_fraction=mismatch,
        nonfinite=n_nonfinite,
        unwritten_rows=n_unwritten,
        max_bound=float(decided_by.max()),
        scale_ratio=_scale_ratio(out64, ref, finite),
        errors=errors,
    )
    return _verdict(path, metrics, rows, bs, n_bad, n_nonfinite, n_unwritten)


def _verdict(
    path: str, metrics: Metrics, rows: int, bs: int, n_bad: int, n_nonfinite: int, n_unwritten: int
) -> PathResult:
    """The outcome and reason the counts give: rows never written, then non-finite outputs,
    then requests over tolerance (the worst of :attr:`Metrics.errors` named)."""
    detail = ""
    if n_unwritten:
        outcome, detail = Outcome.WRONG, "unwritten"
        reason = f"{n_unwritten} of {rows} rows never written (all NaN)"
    elif n_nonfinite:
        outcome, reason = Outcome.NONFINITE, f"{n_nonfinite} non-finite outputs"
    elif n_bad:
        worst = metrics.errors[0]
        outcome, detail = Outcome.WRONG, "tolerance"
        reason = (
            f"{n_bad} of {bs} requests over tolerance; request {worst.request}: "
            f"max |err| {worst.max_abs:.3g} > bound {worst.bound:.3g}"
        )
    else:
        outcome, reason = Outcome.AGREE, ""
    return PathResult(path=path, outcome=outcome, reason=reason, detail=detail, metrics=metrics)


@dataclass(frozen=True, slots=True)
class Part:
    """One case of a launch, for :func:`agreeing`: what :func:`judge` takes for it (its
    output and the oracle's, ``[R_i, H, D]``; its bound and the bound's floor-free part,
    ``[bs_i]``) and each of its requests' query rows (host integers, ``R_i`` in all)."""

    out: torch.Tensor
    ref: torch.Tensor
    new_tokens: Sequence[int]
    bound: torch.Tensor
    within: torch.Tensor


def agreeing(path: str, parts: list[Part]) -> list[PathResult | None]:
    """:func:`judge`'s common case for the cases of one launch together: each case whose every
    output is finite and every row within its bound gets the ``AGREE`` verdict :func:`judge`
    gives it; any other case gets ``None``, for :func:`judge` to decide and explain.

    The launch is judged as one: its rows' errors, bounds and sums are computed over all the
    cases at once, then gathered per case (each case's rows into a row of a padded matrix,
    its requests likewise), and read back in one go. So a launch issues some forty
    operations whatever its number of cases (on a GPU, where each is a launch of its own, the
    cost of judging a case was its twenty-five). The verdict, its maximum error, bound and
    counts are :func:`judge`'s to the bit (maxima and comparisons do not depend on the order
    of evaluation); the relative L2 error and the scale ratio are the same sums taken in
    another order, so they agree with :func:`judge`'s within float64 rounding."""
    verdicts: list[PathResult | None] = [None] * len(parts)
    live = [i for i, p in enumerate(parts) if p.ref.shape[0] > 0]
    if not live:  # nothing to find agreeing: judge's to say what each is
        return verdicts
    figures = _launch_figures([parts[i] for i in live])
    for i, (peak, over, outside, dd, rr, o_r, bound_max, within_max) in zip(
        live, figures, strict=True
    ):
        if not math.isfinite(peak) or over:
            continue
        metrics = Metrics(
            max_abs=peak,
            rel_l2=math.sqrt(dd) / max(math.sqrt(rr), 1e-300),
            mismatch_fraction=0.0,
            nonfinite=0,
            unwritten_rows=0,
            max_bound=within_max if not outside else bound_max,
            scale_ratio=o_r / rr if rr > 0 else None,
        )
        verdicts[i] = PathResult(path=path, outcome=Outcome.AGREE, metrics=metrics)
    return verdicts


def _launch_figures(parts: list[Part]) -> list[list[float]]:
    """Per case (each with rows): its largest row error, how many rows are over their bound
    and how many past the floor-free part, the sums of ``delta**2``, ``ref**2`` and
    ``out * ref``, its largest bound and largest floor-free part."""
    dev = parts[0].ref.device
    n = len(parts)
    rows = [p.ref.shape[0] for p in parts]
    sizes = [p.bound.shape[0] for p in parts]
    # where each row and request goes, built on the host and copied once
    max_rows, max_requests = max(rows), max(sizes)
    by_row = _row_requests([p.new_tokens for p in parts], sizes, rows)
    case_of_row = np.repeat(np.arange(n, dtype=np.int64), rows)
    row_starts = np.cumsum(rows) - rows
    row_at = case_of_row * max_rows + np.arange(by_row.size) - row_starts[case_of_row]
    case_of_request = np.repeat(np.arange(n, dtype=np.int64), sizes)
    request_starts = np.cumsum(sizes) - sizes
    request_at = (
        case_of_request * max_requests + np.arange(sum(sizes)) - request_starts[case_of_request]
    )
    maps = {"rows_to": by_row, "row_cells": row_at, "request_cells": request_at}
    moved = host_copy.to_device(maps, dev)
    rows_to, cells_of_rows = moved["rows_to"], moved["row_cells"]
    cells_of_requests = moved["request_cells"]
    total = by_row.size

    out = torch.cat([p.out for p in parts]).double()
    ref = torch.cat([p.ref for p in parts])
    delta = out - ref
    per_row = torch.stack(
        [
            delta.abs().reshape(total, -1).amax(dim=1),
            delta.square().reshape(total, -1).sum(dim=1),
            ref.square().reshape(total, -1).sum(dim=1),
            (out * ref).reshape(total, -1).sum(dim=1),
        ],
        dim=1,
    )
    bound = torch.cat([p.bound for p in parts]).double()
    within = torch.cat([p.within for p in parts]).double()
    over = ~(per_row[:, 0] <= bound[rows_to])  # a NaN error counts
    outside = ~(per_row[:, 0] <= within[rows_to])
    per_row = torch.cat([per_row, torch.stack([over, outside], dim=1).double()], dim=1)
    cells = torch.zeros(n * max_rows, per_row.shape[1], dtype=torch.float64, device=dev)
    cells.index_put_((cells_of_rows,), per_row)  # each row to its own cell: no two meet
    cells = cells.view(n, max_rows, -1)
    limits = torch.zeros(2, n * max_requests, dtype=torch.float64, device=dev)
    limits[0].index_put_((cells_of_requests,), bound)
    limits[1].index_put_((cells_of_requests,), within)
    figures = torch.cat(
        [
            cells[:, :, 0].amax(dim=1, keepdim=True),  # errors are >= 0: the padding is not a max
            cells[:, :, 4:6].sum(dim=1),
            cells[:, :, 1:4].sum(dim=1),
            limits.view(2, n, max_requests).amax(dim=2).T,
        ],
        dim=1,
    )
    return [list(f) for f in figures.tolist()]


def _row_requests(
    new_tokens: Sequence[Sequence[int]], sizes: Sequence[int], rows: Sequence[int]
) -> np.ndarray:
    """The launch's request of each of its rows (int64, host), its cases' requests numbered
    on from one case to the next: case ``i`` has ``sizes[i]`` requests with ``new_tokens[i]``
    query rows each, ``rows[i]`` in all (checked)."""
    counts = [np.asarray(c, dtype=np.int64) for c in new_tokens]
    for i, c in enumerate(counts):
        if c.size != sizes[i] or int(c.sum()) != rows[i]:
            raise ValueError(
                f"case {i}: {c.size} requests of {int(c.sum())} rows, for bounds of "
                f"{sizes[i]} requests and {rows[i]} rows"
            )
    every = np.concatenate(counts)
    return np.repeat(np.arange(every.size, dtype=np.int64), every)


def _scale_ratio(out: torch.Tensor, ref: torch.Tensor, finite: torch.Tensor | None) -> float | None:
    """``<out, ref> / <ref, ref>`` over the finite elements (``finite``: their mask, ``None``
    when all are; ``None`` when ``ref`` is 0 there)."""
    o, r = (out, ref) if finite is None else (out[finite], ref[finite])
    denom = float((r * r).sum())
    return float((o * r).sum()) / denom if denom > 0 else None


def locate(
    bad: torch.Tensor, err: torch.Tensor, bound: torch.Tensor, row_request: torch.Tensor
) -> tuple[ErrorLocation, ...]:
    """Where the error is: per wrong request, its wrong query rows (counted within the
    request) and heads, worst first. ``row_request`` ``[R]``: the request of each row.

    Everything is reduced on the device and read back at once: a verdict with many wrong
    requests waited for the device five times a located request (each request's rows and heads
    picked out and read back: about a hundred waits a finding at the default GPU limits)."""
    rows, heads = bad.shape[0], bad.shape[1]
    bs = bound.shape[0]
    bad_cells = bad.reshape(rows, heads, -1).any(dim=2)  # [R, H]
    e = torch.nan_to_num(err, nan=float("inf")).reshape(rows, -1).amax(dim=1)
    req_max = torch.zeros(bs, dtype=e.dtype, device=e.device).scatter_reduce(
        0, row_request, e, "amax", include_self=True
    )
    req_heads = torch.zeros(bs, heads, dtype=torch.int32, device=bad.device).index_add_(
        0, row_request, bad_cells.to(torch.int32)
    )
    ratio = req_max / bound.clamp_min(1e-300)
    parts = (bad_cells.any(dim=1), row_request, req_max, bound, ratio, req_heads.flatten() > 0)
    host = torch.cat([t.to(torch.float64).flatten() for t in parts]).tolist()  # one read
    cuts = list(itertools.accumulate((rows, rows, bs, bs, bs, bs * heads)))
    bad_row, request_of, maxima, bounds, ratios, heads_of = (
        host[a:b] for a, b in zip([0, *cuts[:-1]], cuts, strict=True)
    )
    wrong_rows: dict[int, list[int]] = {}
    seen: dict[int, int] = {}
    for r in range(rows):
        b = int(request_of[r])
        position = seen.get(b, 0)  # the row's place among its request's rows
        seen[b] = position + 1
        if bad_row[r]:
            wrong_rows.setdefault(b, []).append(position)
    wrong = sorted(wrong_rows, key=lambda b: (-ratios[b], b))
    return tuple(
        ErrorLocation(
            request=b,
            rows=tuple(wrong_rows[b]),
            heads=tuple(h for h in range(heads) if heads_of[b * heads + h]),
            max_abs=maxima[b],
            bound=bounds[b],
        )
        for b in wrong[:MAX_LOCATED_REQUESTS]
    )


def pair_agreement(
    first: str,
    second: str,
    a: torch.Tensor,
    b: torch.Tensor,
    bound_a: torch.Tensor,
    bound_b: torch.Tensor,
    bs: int,
    rows: torch.Tensor | None = None,
) -> PairAgreement:
    """Two paths agree when they differ by no more than their two bounds together (``rows``:
    the request of each row of a ragged batch)."""
    per_req = _rows_max(a.double() - b.double(), bs, rows)
    bad = (per_req > bound_a + bound_b).nonzero().flatten().tolist()
    return PairAgreement(
        first=first,
        second=second,
        agree=not bad,
        max_abs=float(per_req.max()),
        bad_requests=tuple(bad),
    )


@dataclass(frozen=True, slots=True)
class PairPart:
    """One case's share of :func:`pair_agreements`: its two outputs (``[R_i, H, D]``), each
    of its requests' query rows (host integers, ``R_i`` in all), and each output's bound
    (``[bs_i]``)."""

    a: torch.Tensor
    b: torch.Tensor
    new_tokens: Sequence[int]
    bound_a: torch.Tensor
    bound_b: torch.Tensor


def pair_agreements(first: str, second: str, parts: list[PairPart]) -> list[PairAgreement]:
    """:func:`pair_agreement` of the same two paths on several cases at once, the same
    agreements (maxima and requests; the bounds are added as there), read back from the
    device in one go (each row's request in the launch mapped on the host, copied once)."""
    if not parts:
        return []
    dev = parts[0].a.device
    sizes = [int(p.bound_a.shape[0]) for p in parts]
    offsets = [sum(sizes[:i]) for i in range(len(parts))]
    owners = _row_requests([p.new_tokens for p in parts], sizes, [p.a.shape[0] for p in parts])
    rows = host_copy.to_device({"rows": owners}, dev)["rows"]
    a = torch.cat([p.a for p in parts]).double()
    b = torch.cat([p.b for p in parts]).double()
    diff = torch.nan_to_num((a - b).abs(), nan=float("inf"))
    per_row = diff.reshape(diff.shape[0], -1).amax(dim=1)
    per_req = torch.zeros(sum(sizes), dtype=per_row.dtype, device=dev)
    per_req.scatter_reduce_(0, rows, per_row, "amax", include_self=True)
    limit = torch.cat([p.bound_a for p in parts]) + torch.cat([p.bound_b for p in parts])
    host = torch.stack([per_req, (per_req > limit).double()]).tolist()
    found = []
    for size, start in zip(sizes, offsets, strict=True):
        maxima, over = host[0][start : start + size], host[1][start : start + size]
        bad = tuple(i for i, x in enumerate(over) if x)
        found.append(
            PairAgreement(
                first=first,
                second=second,
                agree=not bad,
                max_abs=max(maxima) if maxima else float("-inf"),
                bad_requests=bad,
            )
        )
    return found
