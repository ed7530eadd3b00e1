"""Argument contracts of the paged-attention kernels, checkable by any caller in a debug mode.

The TRT-LLM kernels trust their metadata: a page table shaped for another batch, sequence
lengths without the new tokens or padded query rows counted as requests make them read out of
bounds (the production crash of ``docs/semantics.md`` §1) or silently attend the wrong keys.
:func:`check_decode_args` and :func:`check_context_args` take the kernel's own keyword arguments
and raise :class:`ContractViolation` with one line naming the argument, its value and what was
expected. They copy small tensors to the host (a device sync): meant for debug runs, tests and
difftest's adapters, which call them before every launch unless ``DIFFTEST_NO_CONTRACTS=1``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import torch

from difftest.model.errors import DifftestError

__all__ = [
    "MIN_WORKSPACE_BYTES",
    "ContractViolation",
    "check_context_args",
    "check_decode_args",
    "contracts_enabled",
]

MIN_WORKSPACE_BYTES = 128 << 20
"""Smallest workspace the checks accept by default (the kernels' docs ask 128 to 256 MiB)."""

KVArg = torch.Tensor | Sequence[torch.Tensor]


class ContractViolation(DifftestError, ValueError):
    """A kernel argument breaks the kernel's contract; the message is one line."""

    def __init__(self, argument: str, value: object, expected: str) -> None:
        self.argument = argument
        self.value = value
        self.expected = expected
        super().__init__(f"contract violation: {argument}={_show(value)}: expected {expected}")


def contracts_enabled() -> bool:
    """False when ``DIFFTEST_NO_CONTRACTS=1`` (to let a bad launch reach the kernel on purpose)."""
    return os.environ.get("DIFFTEST_NO_CONTRACTS", "") not in ("1", "true", "yes")


def _show(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)}:{str(value.dtype).removeprefix('torch.')}@{value.device}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _require(ok: bool, argument: str, value: object, expected: str) -> None:
    if not ok:
        raise ContractViolation(argument, value, expected)


def _tensor(name: str, t: object, ndim: int, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    _require(isinstance(t, torch.Tensor), name, t, "a torch.Tensor")
    assert isinstance(t, torch.Tensor)
    _require(t.dim() == ndim, name, t, f"a {ndim}-D tensor")
    names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    _require(t.dtype in dtypes, name, t, f"dtype in ({names})")
    return t


def _on(name: str, t: torch.Tensor, device: torch.device) -> None:
    _require(t.device == device, name, t, f"on the query's device {device}")


def _last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    _require(t.stride(-1) == 1, f"{name}.stride(-1)", t.stride(-1), "1 (last dim contiguous)")


_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


def _check_kv(kv_cache: KVArg, kv_layout: str, device: torch.device) -> tuple[int, int, int, int]:
    """``(num_pages, num_kv_heads, page_size, head_dim)`` of a paged cache argument."""
    _require(kv_layout in ("HND", "NHD"), "kv_layout", kv_layout, "'HND' or 'NHD'")
    if isinstance(kv_cache, torch.Tensor):
        t = _tensor("kv_cache", kv_cache, 5, _KV_DTYPES)
        _require(t.shape[1] in (1, 2), "kv_cache.shape[1]", t.shape[1], "1 or 2 (K and V)")
        parts = [t[:, 0], t[:, -1]]
    else:
        _require(len(kv_cache) == 2, "kv_cache", kv_cache, "a (K, V) pair")
        parts = [_tensor(f"kv_cache[{i}]", x, 4, _KV_DTYPES) for i, x in enumerate(kv_cache)]
        _require(parts[0].shape == parts[1].shape, "kv_cache[1]", parts[1], "the shape of K")
        _require(parts[0].dtype == parts[1].dtype, "kv_cache[1]", parts[1], "the dtype of K")
    for i, part in enumerate(parts):
        _on(f"kv_cache[{i}]", part, device)
        _last_dim_contiguous(f"kv_cache[{i}]", part)
    pages, a, b, dim = parts[0].shape
    heads, page_size = (a, b) if kv_layout == "HND" else (b, a)
    return pages, heads, page_size, dim


def _host(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.detach().to("cpu", torch.int64).tolist()]


def _seq_lens(seq_lens: object, device: torch.device) -> list[int]:
    s = _tensor("seq_lens", seq_lens, 1, (torch.int32,))
    _on("seq_lens", s, device)
    return _host(s)


def _check_kv_lengths(
    lens: list[int], q_lens: list[int], max_name: str, max_value: int | None
) -> None:
    """Each request's KV length counts its new tokens (``>=`` its query length), and the
    kernel's maximum (``max_seq_len`` or ``max_kv_len``; ``None``: not given) covers the
    longest."""
    for b, (n, m) in enumerate(zip(lens, q_lens, strict=True)):
        _require(n >= m, f"seq_lens[{b}]", n, f">= its query length {m} (counting the new tokens)")
    if max_value is not None:
        longest = max(lens, default=0)
        _require(max_value >= longest, max_name, max_value, f">= max(seq_lens) = {longest}")


def _check_workspace(ws: object, device: torch.device, first_use: bool, min_bytes: int) -> None:
    _require(isinstance(ws, torch.Tensor), "workspace_buffer", ws, "a torch.Tensor")
    assert isinstance(ws, torch.Tensor)
    _on("workspace_buffer", ws, device)
    _require(ws.is_contiguous(), "workspace_buffer", ws, "a contiguous buffer")
    nbytes = ws.numel() * ws.element_size()
    _require(nbytes >= min_bytes, "workspace_buffer.nbytes", nbytes, f">= {min_bytes} bytes")
    if first_use:
        _require(
            not bool(ws.view(torch.uint8).any()),
            "workspace_buffer",
            ws,
            "all zeros on first use (semaphores and counters live in it): torch.zeros",
        )


def _check_table(
    block_tables: object,
    lens: list[int],
    page_size: int,
    num_pages: int,
    device: torch.device,
) -> None:
    t = _tensor("block_tables", block_tables, 2, (torch.int32,))
    _on("block_tables", t, device)
    _last_dim_contiguous("block_tables", t)
    rows, width = t.shape
    _require(rows == len(lens), "block_tables.shape[0]", rows, f"{len(lens)} (one row per request)")
    longest = max(lens, default=0)
    need = -(-longest // page_size)
    _require(
        width >= need,
        "block_tables.shape[1]",
        width,
        f">= {need} columns (ceil(max seq_len {longest} / page_size {page_size}))",
    )
    # Checked where the table is (one flag comes back to the host); the first bad cell is
    # looked up only when there is one.
    table = t.detach()
    pages = [-(-n // page_size) for n in lens]
    used = torch.arange(width, device=table.device).view(1, -1) < torch.tensor(
        pages, dtype=torch.int64, device=table.device
    ).view(-1, 1)  # the columns each request reads
    wrong = used & ((table < 0) | (table >= num_pages))
    if bool(wrong.any()):
        b, col = (int(x) for x in wrong.nonzero()[0])  # row-major: first request first
        _require(
            False,
            f"block_tables[{b}, {col}]",
            int(table[b, col]),
            f"a page id in [0, {num_pages}) (request {b} uses {pages[b]} pages)",
        )


def _check_common(
    query: object,
    kv_cache: KVArg,
    kv_layout: str,
    sinks: torch.Tensor | None,
    out: torch.Tensor | None,
    window_left: int,
) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    q = _tensor("query", query, 3, _Q_DTYPES)
    _last_dim_contiguous("query", q)
    geometry = _check_kv(kv_cache, kv_layout, q.device)
    _, heads, _, dim = geometry
    _require(q.shape[2] == dim, "query.shape[2]", q.shape[2], f"head_dim {dim} of kv_cache")
    _require(
        q.shape[1] % heads == 0,
        "query.shape[1]",
        q.shape[1],
        f"a multiple of num_kv_heads {heads}",
    )
    if sinks is not None:
        s = _tensor("sinks", sinks, 1, (torch.float32,))
        _on("sinks", s, q.device)
        _require(s.shape[0] == q.shape[1], "sinks.shape[0]", s.shape[0], f"{q.shape[1]} (H_q)")
    if out is not None:
        _require(
            isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(q.shape),
            "out",
            out,
            f"shape {list(q.shape)} (the query's)",
        )
        _on("out", out, q.device)
    _require(window_left >= -1, "window_left", window_left, "-1 (no window) or >= 0")
    return q, geometry


def check_decode_args(
    *,
    query: torch.Tensor,
    kv_cache: KVArg,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len_per_req: int | None,
    workspace_buffer: torch.Tensor,
    kv_layout: str = "HND",
    max_seq_len: int | None = None,
    num_pages: int | None = None,
    max_q_len: int | None = None,
    cum_seq_lens_q: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    window_left: int = -1,
    workspace_first_use: bool = False,
    min_workspace_bytes: int = MIN_WORKSPACE_BYTES,
) -> None:
    """Check the arguments of ``trtllm_batch_decode_with_kv_cache`` before a launch.

    Parameters
    ----------
    query, kv_cache, block_tables, seq_lens, q_len_per_req, workspace_buffer, kv_layout,
    max_seq_len, mask, sinks, out, window_left
        The kernel's own arguments. The decode kernel infers ``bs = query.shape[0] //
        q_len_per_req``: every ``L`` query rows are a request, so padding rows must not be
        passed, and ``seq_lens`` must count the ``L`` new tokens.
    max_q_len, cum_seq_lens_q
        The ragged form (SGLang's ragged verify): ``q_len_per_req=None`` with the longest
        query length and the query rows' prefix sums. With ``q_len_per_req`` set the kernel
        overwrites ``max_q_len`` with it and counts every ``q_len_per_req`` rows as a request,
        so passing both is refused.
    num_pages
        Pages in the pool; default: ``kv_cache``'s first dimension.
    workspace_first_use
        True on the first launch with this workspace: it must then be all zeros.

    Raises
    ------
    ContractViolation
        With one line naming the argument, its value and the expectation.
    """
    q, (pages, _, page_size, _) = _check_common(query, kv_cache, kv_layout, sinks, out, window_left)
    rows = q.shape[0]
    lens = _seq_lens(seq_lens, q.device)
    if q_len_per_req is None:
        L, q_lens = _check_ragged_decode(rows, lens, max_q_len, cum_seq_lens_q, q.device)
        bs = len(lens)
    else:
        L = q_len_per_req
        _require(isinstance(L, int) and L >= 1, "q_len_per_req", L, "an integer >= 1")
        _require(
            max_q_len is None and cum_seq_lens_q is None,
            "q_len_per_req",
            L,
            "None with max_q_len/cum_seq_lens_q (the kernel overwrites max_q_len with "
            "q_len_per_req and counts every q_len_per_req rows as a request)",
        )
        _require(rows % L == 0, "query.shape[0]", rows, f"a multiple of q_len_per_req={L}")
        bs = rows // L
        _require(
            len(lens) == bs,
            "query.shape[0]",
            rows,
            f"{len(lens)} requests x q_len_per_req {L} = {len(lens) * L} rows "
            "(padded rows would be counted as requests)",
        )
        q_lens = [L] * bs
    _check_kv_lengths(lens, q_lens, "max_seq_len", max_seq_len)
    n_pages = pages if num_pages is None else num_pages
    _check_table(block_tables, lens, page_size, n_pages, q.device)
    if mask is not None:
        words = 2 * (-(-L // 32))
        m = _tensor("mask", mask, 3, (torch.uint16,))
        _on("mask", m, q.device)
        _require(
            tuple(m.shape) == (bs, L, words), "mask", m, f"shape [{bs}, {L}, {words}] (uint16)"
        )
    _check_workspace(workspace_buffer, q.device, workspace_first_use, min_workspace_bytes)


def _check_ragged_decode(
    rows: int,
    lens: list[int],
    max_q_len: int | None,
    cum_seq_lens_q: torch.Tensor | None,
    device: torch.device,
) -> tuple[int, list[int]]:
    """The decode API's ragged form: ``(max_q_len, each request's query length)``."""
    _require(
        isinstance(max_q_len, int) and max_q_len >= 1,
        "max_q_len",
        max_q_len,
        "an integer >= 1 when q_len_per_req is None",
    )
    assert isinstance(max_q_len, int)
    _require(cum_seq_lens_q is not None, "cum_seq_lens_q", None, "given when q_len_per_req is None")
    cq = _tensor("cum_seq_lens_q", cum_seq_lens_q, 1, (torch.int32,))
    _on("cum_seq_lens_q", cq, device)
    cum = _host(cq)
    _require(
        len(cum) == len(lens) + 1,
        "cum_seq_lens_q.shape[0]",
        len(cum),
        f"batch size + 1 = {len(lens) + 1} (one entry per request of seq_lens, and 0)",
    )
    q_lens = [b - a for a, b in itertools.pairwise(cum)]
    _require(
        cum[0] == 0 and all(n >= 1 for n in q_lens),
        "cum_seq_lens_q",
        cum,
        "prefix sums from 0 of query lengths >= 1",
    )
    _require(cum[-1] == rows, "cum_seq_lens_q[-1]", cum[-1], f"query.shape[0] = {rows}")
    _require(
        max_q_len >= max(q_lens), "max_q_len", max_q_len, f">= the longest query {max(q_lens)}"
    )
    return max_q_len, q_lens


def check_context_args(
    *,
    query: torch.Tensor,
    kv_cache: KVArg,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    batch_size: int,
    cum_seq_lens_q: torch.Tensor,
    cum_seq_lens_kv: torch.Tensor,
    workspace_buffer: torch.Tensor,
    kv_layout: str = "HND",
    num_pages: int | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    window_left: int = -1,
    workspace_first_use: bool = False,
    min_workspace_bytes: int = MIN_WORKSPACE_BYTES,
) -> None:
    """Check the arguments of the prefill kernels (``trtllm_batch_context_with_kv_cache``,
    ``trtllm_fmha_v2_prefill`` with a paged cache) before a launch.

    Query rows past ``cum_seq_lens_q[batch_size]`` are padding the kernel ignores. FMHAv2 reads
    KV lengths from ``cum_seq_lens_kv``, TRT-LLM gen from ``seq_lens``: they must agree.

    Raises
    ------
    ContractViolation
        With one line naming the argument, its value and the expectation.
    """
    q, (pages, _, page_size, _) = _check_common(query, kv_cache, kv_layout, sinks, out, window_left)
    _require(
        isinstance(batch_size, int) and batch_size >= 1, "batch_size", batch_size, "an int >= 1"
    )
    lens = _seq_lens(seq_lens, q.device)
    _require(len(lens) == batch_size, "seq_lens.shape[0]", len(lens), f"batch_size={batch_size}")
    cq = _tensor("cum_seq_lens_q", cum_seq_lens_q, 1, (torch.int32,))
    ck = _tensor("cum_seq_lens_kv", cum_seq_lens_kv, 1, (torch.int32,))
    for name, c in (("cum_seq_lens_q", cq), ("cum_seq_lens_kv", ck)):
        _on(name, c, q.device)
        _require(c.shape[0] == batch_size + 1, f"{name}.shape[0]", c.shape[0], "batch_size + 1")
    cum_q, cum_kv = _host(cq), _host(ck)
    _require(cum_q[0] == 0, "cum_seq_lens_q[0]", cum_q[0], "0")
    q_lens = [b - a for a, b in itertools.pairwise(cum_q)]
    neg = [i for i, n in enumerate(q_lens) if n < 0]
    _require(not neg, "cum_seq_lens_q", cum_q, "non-decreasing prefix sums of query lengths")
    _require(
        cum_q[-1] <= q.shape[0],
        "cum_seq_lens_q[-1]",
        cum_q[-1],
        f"<= query.shape[0]={q.shape[0]} (rows past it are ignored padding)",
    )
    _require(
        max_q_len >= max(q_lens, default=0),
        "max_q_len",
        max_q_len,
        f">= the longest query length {max(q_lens, default=0)}",
    )
    expect_kv = [0]
    for n in lens:
        expect_kv.append(expect_kv[-1] + n)
    if cum_kv != expect_kv:
        b = next(i for i, (x, y) in enumerate(zip(cum_kv, expect_kv, strict=True)) if x != y)
        _require(
            False, f"cum_seq_lens_kv[{b}]", cum_kv[b], f"{expect_kv[b]} (prefix sum of seq_lens)"
        )
    _check_kv_lengths(lens, q_lens, "max_kv_len", max_kv_len)
    n_pages = pages if num_pages is None else num_pages
    _check_table(block_tables, lens, page_size, n_pages, q.device)
    _check_workspace(workspace_buffer, q.device, workspace_first_use, min_workspace_bytes)
