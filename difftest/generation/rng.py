"""A counter-based random number generator that gives the same bits on every device.

``torch.Generator`` streams differ between CPU and CUDA, so a case built on a GPU would not
match the same case built on a laptop. Here every value is a pure function of
``(seed, stream, coordinates)``: a splitmix64 hash in wrapping int64 arithmetic, which torch
computes identically on any device. Normal-looking values come from an Irwin-Hall sum of four
16-bit uniforms, converted exactly to float64 and scaled by correctly rounded operations, so
the float bits match too. Because values are keyed by logical coordinates (request, token,
head, dim) rather than by tensor layout, dropping a request or shortening a prefix leaves the
other values unchanged, which keeps shrinking stable.

Every stream the project draws from is named in :class:`Stream`; its numbers are part of what
a case means (changing one changes the bits of every stored case).

Speed. The hashes are the generator's whole cost, so :func:`normals`, which hashes the last
(innermost, widest) coordinate and turns it into normals, works in place on two buffers, and
on a CPU running torch on one thread (as the tests do) hands the same integer arithmetic to
numpy, whose uint64 multiply and logical shift are several times cheaper than torch's int64
ones, in blocks that stay in cache. Wrapping integer arithmetic is exact and converting an
integer below 2**53 to float64 is exact, so every path gives the same bits. On a CUDA device
with Triton, :mod:`difftest.generation.fused_normals` does the same in one kernel, checked
against the torch form at first use.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
import torch

from difftest.generation import fused_normals, splitmix
from difftest.machine import host_copy


class Stream(enum.IntEnum):
    """Every random stream of the project and its number (the numbers are part of the bits)."""

    Q = 1
    K = 2
    V = 3
    SINKS = 4
    STALE_K = 5
    STALE_V = 6
    PAD = 7
    """Query rows of data-parallel padding."""
    BASE = 8
    """The per-(head, dim) base of the ``near_ties`` keys."""
    OUTLIER = 9
    """Which tokens of ``outlier_tokens`` are outliers."""
    PAGE_ORDER = 10
    """The ``shuffled`` page permutation."""
    STALE_PAGES = 11
    """The ``stale_pages`` table fill."""
    CASE_SEED = 12
    """A campaign's per-chunk case seeds."""
    GRAPH_QUERY = 13
    """Query rows earlier batches left in a CUDA graph's static buffer."""
    GRAPH_TABLE = 14
    """Page ids earlier batches left in a CUDA graph's static page table."""


_GOLDEN, _M1, _M2, _MASK = splitmix.GOLDEN, splitmix.M1, splitmix.M2, splitmix.MASK
_U64 = (1 << 64) - 1
_FIELDS = 0x0000FFFF0000FFFF  # 16-bit fields 0 and 2 of a 64-bit hash
_NORMAL_SCALE = splitmix.NORMAL_SCALE
NUMPY_ON_CPU: bool | None = None
"""Whether CPU tensors are hashed in numpy; ``None``: when torch runs on one thread (numpy's
steps run on one, faster than torch's on one, slower than torch's on many). The same bits
either way; the tests check both."""


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & _MASK[s]


# -- the two in-place steps, in torch (int64, any device) and in numpy (uint64, CPU) ----------


def _finish_(x: torch.Tensor, t: torch.Tensor) -> None:
    """The splitmix64 finaliser after its ``+ golden``, in place on ``x`` (``t``: scratch)."""
    for s, m in ((30, _M1), (27, _M2)):
        torch.bitwise_right_shift(x, s, out=t).bitwise_and_(_MASK[s])
        x.bitwise_xor_(t).mul_(m)
    torch.bitwise_right_shift(x, 31, out=t).bitwise_and_(_MASK[31])
    x.bitwise_xor_(t)


def _normal_(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """:func:`std_normal` of the hashes ``x``, written over ``x`` as float64 (``t``: scratch)."""
    # The sum of the four 16-bit fields: fields 0+1 and 2+3 side by side in the two 32-bit
    # halves, then both halves added in the top half by a multiply by 2**32 + 1.
    torch.bitwise_and(x, _FIELDS, out=t)
    x.bitwise_right_shift_(16).bitwise_and_(_FIELDS).add_(t).mul_((1 << 32) + 1)
    torch.bitwise_right_shift(x, 32, out=t)
    # Each 16-bit uniform has variance 65536**2 / 12 (to within 2**-16), so four have
    # standard deviation 65536 / sqrt(3). The sum is below 2**18: exact in float64.
    normal = x.view(torch.float64).copy_(t)
    return normal.sub_(131070.0).mul_(_NORMAL_SCALE)


_NP = {
    name: np.uint64(value & _U64)
    for name, value in (
        ("golden", _GOLDEN),
        ("m1", _M1),
        ("m2", _M2),
        ("fields", _FIELDS),
        ("spread", (1 << 32) + 1),
        *((f"shift{s}", s) for s in (16, 27, 30, 31, 32)),
    )
}


def _np_finish_(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """:func:`_finish_` in numpy's uint64, whose right shift is logical (and multiply cheap)."""
    for s, m in ((30, _NP["m1"]), (27, _NP["m2"])):
        np.bitwise_xor(x, np.right_shift(x, _NP[f"shift{s}"], out=t), out=x)
        np.multiply(x, m, out=x)
    np.bitwise_xor(x, np.right_shift(x, _NP["shift31"], out=t), out=x)
    return x


def _np_normal_(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """:func:`_normal_` in numpy."""
    np.bitwise_and(x, _NP["fields"], out=t)
    np.bitwise_and(np.right_shift(x, _NP["shift16"], out=x), _NP["fields"], out=x)
    np.multiply(np.add(x, t, out=x), _NP["spread"], out=x)
    np.right_shift(x, _NP["shift32"], out=t)
    normal = x.view(np.float64)
    np.copyto(normal, t.view(np.int64), casting="unsafe")
    np.subtract(normal, 131070.0, out=normal)
    return np.multiply(normal, _NORMAL_SCALE, out=normal)


NUMPY_BLOCK = 1 << 15
"""Elements :func:`normals` takes through all its numpy steps at once (two such uint64 blocks
stay in a core's L2 cache, so the steps after the first read no main memory)."""


def _np_normals(prefix: np.ndarray, n: int) -> np.ndarray:
    """:func:`normals` in numpy, in blocks of :data:`NUMPY_BLOCK` elements."""
    rows = prefix.reshape(-1)
    out = np.empty((rows.size, n), dtype=np.uint64)
    last = np.add(np.arange(n, dtype=np.uint64), _NP["golden"])
    step = max(1, NUMPY_BLOCK // n)
    scratch = np.empty((min(step, rows.size), n), dtype=np.uint64)
    for r in range(0, rows.size, step):
        x, t = out[r : r + step], scratch[: min(step, rows.size - r)]
        _np_normal_(_np_finish_(np.add(rows[r : r + step, None], last, out=x), t), t)
    return out.view(np.float64).reshape(*prefix.shape, n)


def _on_numpy(x: torch.Tensor) -> bool:
    if x.device.type != "cpu":
        return False
    return torch.get_num_threads() == 1 if NUMPY_ON_CPU is None else NUMPY_ON_CPU


def _np(x: torch.Tensor) -> np.ndarray:
    """An int64 CPU tensor as a uint64 array (a view: no copy)."""
    return (x if x.dtype == torch.int64 else x.to(torch.int64)).numpy().view(np.uint64)


def _np_mix(x: np.ndarray) -> np.ndarray:
    """:func:`mix` of a uint64 array, in a new array."""
    h = np.add(x, _NP["golden"], out=np.empty(np.shape(x), dtype=np.uint64))
    return _np_finish_(h, np.empty_like(h))


# -- the generator ----------------------------------------------------------------------------


def mix(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser, on int64 tensors with wrapping arithmetic."""
    if _on_numpy(x):
        return torch.from_numpy(_np_mix(_np(x)).view(np.int64))
    h = x + _GOLDEN
    _finish_(h, torch.empty_like(h))
    return h


def _mix_int(x: int) -> int:
    """:func:`mix` of one Python integer (as int64, the same bits)."""
    x = (x + _GOLDEN) & _U64
    x = ((x ^ (x >> 30)) * (_M1 & _U64)) & _U64
    x = ((x ^ (x >> 27)) * (_M2 & _U64)) & _U64
    x ^= x >> 31
    return x - (1 << 64) if x >> 63 else x


def key(seed: int, stream: Stream) -> int:
    """The root key of one stream, as a Python int64."""
    return _mix_int(_mix_int(seed & ((1 << 63) - 1)) + int(stream))


def keyed(seed: int, stream: Stream, device: torch.device | str) -> torch.Tensor:
    """The root key of one stream (a 0-d int64 tensor; filled on the device, so no copy from
    the host that would wait for the device's queued work)."""
    return torch.full((), key(seed, stream), dtype=torch.int64, device=device)


def hash_ints(key: int, *coords: int) -> int:
    """:func:`hash_coords` of Python integers (as int64, the same bits), without a tensor:
    for the planner's one-number hashes, where a tensor's set-up costs more than the hash."""
    h = key
    for c in coords:
        h = _mix_int(h + c)
    return h


def host_hash(key: int | np.ndarray, *coords: np.ndarray) -> np.ndarray:
    """:func:`hash_coords` on the host, of a Python key and broadcastable int64 numpy
    coordinates: int64, the same bits (for the integer plans :mod:`placement` computes).
    ``key`` may be int64 hashes already folded (an array, broadcast with ``coords``): the
    hash goes on from them, ``host_hash(host_hash(k, a)[i], b) == host_hash(k, a[i], b)``."""
    if isinstance(key, np.ndarray):
        h = np.asarray(key, dtype=np.int64).view(np.uint64)
    else:
        h = np.array(key & _U64, dtype=np.uint64)
    for c in coords:
        h = _np_mix(np.add(h, np.asarray(c, dtype=np.int64).view(np.uint64)))
    return h.view(np.int64)


def host_uniform(h: np.ndarray) -> np.ndarray:
    """:func:`uniform` of int64 hashes on the host (the same bits)."""
    return np.right_shift(h.view(np.uint64), np.uint64(11)).astype(np.float64) * 2.0**-53


def host_std_normal(h: np.ndarray) -> np.ndarray:
    """:func:`std_normal` of int64 hashes on the host (the same bits), in a new array."""
    x = np.array(h, dtype=np.int64).view(np.uint64)
    return _np_normal_(x, np.empty_like(x))


def hash_coords(key: torch.Tensor, *coords: torch.Tensor) -> torch.Tensor:
    """Fold broadcastable int64 coordinate tensors into one hash per element."""
    if _on_numpy(key):
        hn = _np(key)
        for c in coords:
            hn = _np_mix(np.add(hn, _np(c)))
        return torch.from_numpy(hn.view(np.int64))
    h = key
    for c in coords:
        h = (h + c.to(torch.int64)).add_(_GOLDEN)
        _finish_(h, torch.empty_like(h))
    return h


def normals(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """``std_normal(hash_coords(prefix[..., None], arange(n)))``: float64 ``prefix.shape + (n,)``.

    The innermost coordinate of every value family, hashed and turned into normals in place
    (this is where the generator spends its time).
    """
    if _on_numpy(prefix):
        return torch.from_numpy(_np_normals(_np(prefix), n))
    return _torch_normals(prefix, n)


def token_normals(
    keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int
) -> torch.Tensor:
    """The normals of every (key, token, head, dim): float64 ``[len(keys), N, heads, n]``.

    ``columns`` are the tokens' coordinates, 1-d int64 tensors of ``N`` each (a request and a
    position, say); the value at ``[r, i, h, d]`` is ``normals(hash_coords(keys[r],
    columns[0][i], ..., h), n)[d]``. This is the shape of every value family's draw, and on a
    CUDA device with Triton it is one kernel (:mod:`fused_normals`, the same bits).
    """
    dev = columns[0].device
    if fused_normals.usable(dev):
        return fused_normals.token_normals(keys, columns, heads, n, _torch_token_normals)
    return _torch_token_normals(keys, columns, heads, n)


def _torch_token_normals(
    keys: Sequence[int], columns: Sequence[torch.Tensor], heads: int, n: int
) -> torch.Tensor:
    """:func:`token_normals` by :func:`hash_coords` and :func:`normals` (any device)."""
    dev = columns[0].device
    roots = host_copy.ints_to_device(list(keys), dev).view(-1, 1, 1)
    coords = [c.reshape(1, -1, 1) for c in columns]
    return normals(hash_coords(roots, *coords, arange(heads, dev).view(1, 1, -1)), n)


def _torch_normals(prefix: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`normals` in torch elementwise passes (any device)."""
    x = prefix.unsqueeze(-1) + (arange(n, prefix.device) + _GOLDEN)
    t = torch.empty_like(x)
    _finish_(x, t)
    return _normal_(x, t)


def uniform(h: torch.Tensor) -> torch.Tensor:
    """Uniform float64 in ``[0, 1)`` from 53 bits of the hash."""
    return _shr(h, 11).to(torch.float64) * 2.0**-53


def std_normal(h: torch.Tensor) -> torch.Tensor:
    """Approximately standard normal float64 (Irwin-Hall of four 16-bit uniforms), in ±3.47."""
    if _on_numpy(h):
        xn = _np(h).copy()
        return torch.from_numpy(_np_normal_(xn, np.empty_like(xn)))
    x = h.clone()
    return _normal_(x, torch.empty_like(x))


def arange(n: int, device: torch.device | str) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64, device=device)
