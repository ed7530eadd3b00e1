"""Where a finding's error is, and what the wrong rows saw.

For each wrong request: its wrong query rows and heads and by how much (from a rerun of the path
on this machine when it can run here, else from the metrics stored in the repro); for each wrong
row, the KV positions it may see (its position, the window, the draft mask) and the physical
pages holding them; and, with a rerun, which simple mistakes reproduce the kernel's output
exactly: visibility (a window one key too wide, a row that sees the next draft token, the draft
mask ignored, ...: the KV positions the row would have had to see differently), a page column
read from another column's page, a scale applied in the wrong place, or the sinks ignored.
Visibility and softmax are the oracle's own (:func:`difftest.oracle.attention.visible_keys`,
:func:`difftest.oracle.attention.softmax_with_sinks`): a hypothesis is the oracle's rule with
one thing changed, never a restatement of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from difftest.execution.evaluate import run_path
from difftest.generation.materialize import materialize
from difftest.judgement import tolerance as compare
from difftest.judgement.tolerance import Tolerance
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.model.errors import UnknownPath
from difftest.model.outcome import ErrorLocation, Finding, Outcome, PathResult
from difftest.oracle import fused
from difftest.oracle.attention import softmax_with_sinks
from difftest.paths.registry import KernelPath, get_path
from difftest.triage.location import (
    Ranges,
    locate_pages,
    page_table,
    pages_of,
    visible_positions,
    visible_ranges,
)

LOST_OUTPUT = {Outcome.RAISED: "raised", Outcome.CRASH: "crashed", Outcome.HANG: "hung"}
"""Outcomes with no output, and what the path did."""
MAX_DIAGNOSED_REQUESTS = 4
MAX_SWAPPED_COLUMNS = 8
"""Page-swap hypotheses cover the first this many page columns of a request."""
EXPLAINED_SHARE = 0.5
"""A mistake explains a wrong row when, made, it leaves at most this share of the row's error
(and the rest within the bound)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorMap:
    """The error of one path on one case, per query row and head."""

    source: str
    """Where the numbers come from: a rerun here, or the repro's stored metrics."""
    errors: list[ErrorLocation]
    """Per wrong request (worst first), as :func:`difftest.judgement.tolerance.locate` gives
    them."""
    err: torch.Tensor | None = None
    """float64 ``[R, H_q]``: max ``|out - ref|`` over head_dim (``inf`` for NaN); rerun only."""
    bound: torch.Tensor | None = None
    """float64 ``[bs]``: each request's tolerance; rerun only."""
    diagnoses: dict[tuple[int, int], list[str]] | None = None
    """``(request, row)`` -> visibility mistakes that reproduce the kernel's row."""
    output: torch.Tensor | None = None
    """The kernel's output ``[R, H_q, D]`` (CPU) the map was computed from, if any."""

    def heatmap(self, case: Case) -> torch.Tensor:
        """float64 ``[R, H_q]``: error over the request's bound (> 1 is wrong). Without a
        rerun, the stored wrong rows x heads of each request get its max error ratio."""
        counts = torch.tensor(case.batch.new_tokens(), dtype=torch.int64)
        first = case.batch.first_rows()
        if self.err is not None and self.bound is not None:
            row_bound = self.bound.repeat_interleave(counts.to(self.bound.device))
            return self.err / row_bound.clamp_min(1e-300).view(-1, 1)
        grid = torch.zeros(case.batch.num_query_rows, case.attention.num_qo_heads)
        for e in self.errors:
            ratio = e.max_abs / max(e.bound, 1e-300)
            rows = torch.tensor([first[e.request] + r for r in e.rows], dtype=torch.int64)
            heads = torch.tensor(list(e.heads), dtype=torch.int64)
            if len(rows) and len(heads):
                grid[rows.view(-1, 1), heads.view(1, -1)] = ratio
        return grid.double()


def error_map(
    case: Case,
    finding: Finding | None,
    device: torch.device,
    *,
    recorded: PathResult | None = None,
    tolerance: Tolerance | None = None,
    rerun: bool = True,
    stored: Mapping[str, torch.Tensor] | None = None,
) -> ErrorMap:
    """Rerun the finding's path on ``case`` here when it can run; else use the kernel output
    ``stored`` with the repro (its sidecar's ``out`` and ``bound``); else the ``recorded``
    verdict's metrics. ``tolerance``: the rules the rerun is judged by (default: the tool's)."""
    reason = "the repro has no finding" if finding is None else "--no-rerun"
    if finding is not None and rerun:
        try:
            path: KernelPath | None = get_path(finding.path)
        except UnknownPath:
            path, reason = None, f"path {finding.path!r} is not registered here"
        if path is not None:
            reason = path.support(case, device) or ""
            if not reason:
                emap = _rerun(case, path, device, tolerance or Tolerance())
                if emap is not None:
                    return emap
                reason = "the path returned no output on the rerun"
    if stored is not None and "out" in stored and "bound" in stored:
        batch = materialize(case, torch.device("cpu"))
        source = f"the kernel output stored with the repro ({reason})"
        return _map(batch, stored["out"].cpu(), stored["bound"].double().cpu(), source)
    errors = list(recorded.metrics.errors) if recorded else []
    return ErrorMap(source=f"stored metrics ({reason or 'no rerun'})", errors=errors)


def _rerun(case: Case, path: KernelPath, device: torch.device, tol: Tolerance) -> ErrorMap | None:
    batch = materialize(case, device)
    ref = compare.reference(batch, fused.batched_attention)
    floor = compare.noise_floor(batch, ref, path.precision(case), fused.batched_attention)
    bound = compare.request_bounds(batch, ref, floor, tol)
    out, _ = run_path(path, batch)
    if out is None:
        return None
    return _map(batch, out, bound, f"rerun of {path.name} on {device}", ref)


def _map(
    batch: Batch,
    out: torch.Tensor,
    bound: torch.Tensor,
    source: str,
    ref: torch.Tensor | None = None,
) -> ErrorMap:
    """The error map of output ``out`` on ``batch`` against the oracle, judged by ``bound``."""
    ref = compare.reference(batch, fused.batched_attention) if ref is None else ref
    out = out.to(batch.device)
    bound = bound.to(batch.device)
    verdict = compare.judge("map", batch, out, ref, bound)
    err = torch.nan_to_num((out.double() - ref).abs(), nan=float("inf")).amax(dim=-1).cpu()
    diagnoses: dict[tuple[int, int], list[str]] = {}
    for located in verdict.metrics.errors[:MAX_DIAGNOSED_REQUESTS]:
        b = located.request
        for row in located.rows:
            diagnoses[(b, row)] = diagnose_row(batch, out, b, row, float(bound[b]))
    return ErrorMap(
        source=source,
        errors=list(verdict.metrics.errors),
        err=err,
        bound=bound.double().cpu(),
        diagnoses=diagnoses,
        output=out.cpu(),
    )


def _hypotheses(case: Case, request: int, row: int) -> dict[str, list[int]]:
    """Alternative visible key sets for one row: plausible kernel mistakes, each different from
    the row's true set, ascending, and inside ``[0, seq_len)`` (possibly empty). The window
    and draft-mask mistakes are the oracle's rules with another window or mask."""
    seq = case.batch.seq_lens()[request]
    n = case.batch.new_tokens()[request]  # L, or the request's own count when ragged
    first_new, pos = seq - n, seq - n + row
    truth = visible_positions(case, request, row)
    w = case.attention.window_left
    out: dict[str, list[int]] = {}
    if w >= 0:
        out["window one key too wide"] = visible_positions(case, request, row, window_left=w + 1)
        # A window of width 0 narrowed by one key sees nothing (-1 would mean no window).
        narrow = visible_positions(case, request, row, window_left=w - 1) if w >= 1 else []
        out["window one key too narrow"] = narrow
        out["window measured from the request's last position"] = [
            k for k in truth if k >= seq - 1 - w
        ]
        out["no window"] = visible_positions(case, request, row, window_left=-1)
    if pos + 1 < seq:
        out["sees the next draft token"] = sorted({*truth, pos + 1})
    out["does not see itself"] = [k for k in truth if k != pos]
    out["sees the whole draft block"] = sorted(set(truth) | set(range(first_new, seq)))
    out["sees only the prefix"] = [k for k in truth if k < first_new]
    if case.batch.draft.kind == "tree":
        plain = visible_positions(case, request, row, draft_mask=False)
        out["draft mask ignored (plain causal)"] = plain
    return {name: keys for name, keys in out.items() if keys != truth}


def _scale_mistakes(case: Case) -> dict[str, tuple[float, float]]:
    """Scales applied in the wrong place: ``name -> (bmm1_scale, bmm2_scale)`` as used."""
    a = case.attention
    bmm1, bmm2 = a.bmm1_scale, a.bmm2_scale
    out = {
        "bmm2_scale (v_scale / o_scale) not applied": (bmm1, 1.0),
        "bmm2_scale applied twice": (bmm1, bmm2 * bmm2),
        "o_scale multiplied instead of divided": (bmm1, a.v_scale * a.o_scale),
        "o_scale not applied": (bmm1, a.v_scale),
        "v_scale not applied": (bmm1, 1.0 / a.o_scale),
        "q_scale and k_scale not applied (bmm1 = sm_scale)": (a.effective_sm_scale, bmm2),
        "sm_scale not applied": (a.q_scale * a.k_scale, bmm2),
        "k_scale applied twice": (bmm1 * a.k_scale, bmm2),
    }
    return {name: scales for name, scales in out.items() if scales != (bmm1, bmm2)}


def _row_output(
    batch: Batch,
    request: int,
    row: int,
    keys: list[int],
    pages: list[int],
    scales: tuple[float, float] | None = None,
    *,
    sinks: bool = True,
) -> torch.Tensor:
    """float64 ``[H_q, D]``: the row's attention over exactly ``keys`` (KV positions of the
    request, inside ``[0, seq_len)``; none gives the oracle's empty row, 0), page column ``c``
    read from physical page ``pages[c]``, with ``scales = (bmm1, bmm2)`` (default: the
    case's), with the case's sinks unless ``sinks=False``. The softmax is the oracle's
    (:func:`difftest.oracle.attention.softmax_with_sinks`)."""
    seq = int(batch.seq_lens[request])
    if any(not 0 <= k < seq for k in keys):
        raise ValueError(f"keys {keys} of a request with seq_len {seq}")
    bmm1, bmm2 = scales or (batch.bmm1_scale, batch.bmm2_scale)
    a = batch.case.attention
    ps = a.page_size
    q = batch.q[batch.case.batch.first_rows()[request] + row].double()  # [H_q, D]
    # The oracle's masked keys hold -inf: an empty set is one key (the row's own), masked.
    gathered = keys or [seq - batch.case.batch.new_tokens()[request] + row]
    idx = torch.tensor(gathered, dtype=torch.int64, device=batch.device)
    page = torch.tensor(pages, dtype=torch.int64, device=batch.device)[idx // ps]
    kv_head = torch.arange(a.num_qo_heads, device=batch.device) // a.group_size
    k = batch.k_pages[page, :, idx % ps].double()[:, kv_head]  # [T, H_q, D]
    v = batch.v_pages[page, :, idx % ps].double()[:, kv_head]
    if not keys:
        k, v = torch.zeros_like(k), torch.zeros_like(v)
    s = bmm1 * torch.einsum("hd,thd->ht", q, k)  # [H_q, T]
    if not keys:
        s = torch.full_like(s, float("-inf"))
    sink = None if batch.sinks is None or not sinks else batch.sinks.double()
    p = softmax_with_sinks(s, sink)
    return bmm2 * torch.einsum("ht,thd->hd", p, v)


def _page_swaps(case: Case, pages: list[int], keys: list[int]) -> dict[str, list[int]]:
    """Page-table mistakes: one visible page column read from another column's page."""
    ps = case.attention.page_size
    cols = sorted({k // ps for k in keys})[:MAX_SWAPPED_COLUMNS]
    out = {}
    for c in cols:
        for other in range(min(len(pages), MAX_SWAPPED_COLUMNS)):
            if other != c and pages[other] != pages[c]:
                swapped = list(pages)
                swapped[c] = pages[other]
                name = (
                    f"reads page column {c} (KV {c * ps}..{c * ps + ps - 1}) from page "
                    f"{pages[other]} (column {other}'s)"
                )
                out[name] = swapped
    return out


@dataclass(frozen=True, slots=True)
class _Trial:
    """One simple mistake: the row computed over ``keys``, page table ``pages``, ``scales``
    (``None``: the case's) and with or without the case's sinks."""

    name: str
    keys: list[int]
    pages: list[int]
    scales: tuple[float, float] | None = None
    sinks: bool = True


def diagnose_row(
    batch: Batch, out: torch.Tensor, request: int, row: int, bound: float
) -> list[str]:
    """The visibility, page-table, scale and sink mistakes whose exact output matches the
    kernel's row within ``bound`` and explains the row's error: what is left of it with the
    mistake made is at most :data:`EXPLAINED_SHARE` of it. (A row barely over its bound is
    otherwise "matched" by any mistake that moves it a hair toward the kernel's output, as a
    page of keys with next to no weight does.)"""
    got = out[batch.case.batch.first_rows()[request] + row].double()
    if not bool(torch.isfinite(got).all()):
        return []
    case = batch.case
    pages = [int(p) for p in batch.block_tables[request, : case.pages_per_request()[request]]]
    truth = visible_positions(case, request, row)
    error = float((got - _row_output(batch, request, row, truth, pages)).abs().max())
    enough = min(bound, EXPLAINED_SHARE * error)
    trials = [_Trial(name, keys, pages) for name, keys in _hypotheses(case, request, row).items()]
    trials += [
        _Trial(name, truth, swapped) for name, swapped in _page_swaps(case, pages, truth).items()
    ]
    trials += [_Trial(name, truth, pages, sc) for name, sc in _scale_mistakes(case).items()]
    if batch.sinks is not None:
        trials.append(_Trial("sinks ignored", truth, pages, sinks=False))
    matches = []
    for t in trials:
        guess = _row_output(batch, request, row, t.keys, t.pages, t.scales, sinks=t.sinks)
        if float((got - guess).abs().max()) <= enough:
            matches.append(t.name)
    return matches


def describe_ranges(ranges: Ranges) -> str:
    return ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in ranges) or "nothing"


def explain_lines(case: Case, finding: Finding | None, emap: ErrorMap) -> list[str]:
    """The error map as text: per wrong request, its rows, heads, visible KV and pages."""
    lines = []
    if finding is not None:
        lines.append(f"{finding.path} {finding.kind.value}: {finding.reason}")
    a, b = case.attention, case.batch
    lines.append(
        f"case {case.digest()}: {len(b.prefix_lens)} requests (+{b.padding_requests} padding), "
        f"L={b.q_len}{f' (new tokens {list(b.q_lens)})' if b.q_lens is not None else ''}, "
        f"prefixes {list(b.prefix_lens)}, H_q={a.num_qo_heads} "
        f"H_kv={a.num_kv_heads} D={a.head_dim}, page_size={a.page_size}, "
        f"window_left={a.window_left}, draft={b.draft.kind}"
    )
    lines.append(f"error map from {emap.source}")
    if not emap.errors:
        kind = finding.kind if finding is not None else None
        if kind in LOST_OUTPUT:
            lines.append(f"no output to map: the path {LOST_OUTPUT[kind]} (reason above)")
        else:
            lines.append("no wrong request located")
        return lines
    table = page_table(case)
    for located in locate_pages(case, emap.errors):
        err = located.error
        req = err.request
        pad = " (padding request)" if located.padding else ""
        lines.append(
            f"request {req}{pad}: prefix {located.prefix_len}, seq_len {located.seq_len}, "
            f"max |err| {err.max_abs:.4g} > bound {err.bound:.4g}; "
            f"wrong rows {list(err.rows)}, heads {list(err.heads)}; "
            f"pages {list(located.pages[:16])}{' ...' if len(located.pages) > 16 else ''}"
        )
        for row in err.rows:
            ranges = visible_ranges(case, req, row)
            position = located.seq_len - b.new_tokens()[req] + row
            pages = pages_of(case, table, req, ranges)
            shown = f"{pages[:16]}" if len(pages) <= 16 else f"{pages[:16]} (+{len(pages) - 16})"
            text = (
                f"  row {row} (position {position}): sees KV {describe_ranges(ranges)} "
                f"on pages {shown}"
            )
            if emap.err is not None:
                worst = emap.err[b.first_rows()[req] + row]
                text += f"; max |err| {float(worst.max()):.4g} (head {int(worst.argmax())})"
            lines.append(text)
            diagnosed = (emap.diagnoses or {}).get((req, row))
            if diagnosed:
                lines.append(f"    matches the kernel exactly if the row: {'; '.join(diagnosed)}")
            elif emap.diagnoses is not None and (req, row) in emap.diagnoses:
                lines.append(
                    "    no simple visibility, page-table or scale mistake reproduces this row"
                )
    return lines
