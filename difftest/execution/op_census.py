"""What tensor operations a piece of work dispatches, and which of them would wait for a GPU.

On a GPU a campaign's host time goes largely to issuing operations: each is a dispatch on the
host and, for most, a kernel launch of 5-20 us. Some also make the host wait until the device
has finished everything queued before them, because the host needs a result to go on: the
size of a ``nonzero``, a boolean index or a ``repeat_interleave`` without its output size, a
number read back (``item``), or a tensor built from host data (``torch.tensor(list)``), which
is copied from pageable memory after the queued work. A wait keeps the host from queueing the
next operations while the device runs, so the two take turns instead of overlapping.

Both can be counted on any machine, CPU included: :class:`Census` is a dispatch mode that
counts each aten operation under the part of the work that issued it, apart from the views
(a slice, a permutation, a reinterpretation: host bookkeeping, no device work), and notes the
ones of :func:`waits_for_device`. ``benchmarks/count_ops.py`` prints the counts of a packed launch;
tests hold generation to no waits at all. (Reading a tensor with ``tolist`` does not dispatch
on a CPU, so it is not seen here; on a GPU it waits too.)
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

UNCOUNTED = {aten.detach.default}
"""Not counted: autograd's bookkeeping."""

_ALWAYS_WAIT = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._local_scalar_dense.default,
    aten.lift_fresh.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
}


def waits_for_device(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether aten operation ``func`` with these arguments makes the host wait for a CUDA
    device's queued work (see the module's docstring)."""
    if func in _ALWAYS_WAIT:
        return True
    if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    if func in (aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor):
        return kwargs.get("output_size") is None
    return False


class Census(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the operations dispatched while active, under :attr:`part` (set it to label
    what follows; ``None``: not counted): those that compute (:attr:`counts`), the views
    (:attr:`views`), and the waits among either (:attr:`waits`)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.part: str | None = "other"
        self.counts: collections.Counter[str] = collections.Counter()
        self.views: collections.Counter[str] = collections.Counter()
        self.waits: collections.Counter[str] = collections.Counter()
        self.waiting_ops: collections.Counter[str] = collections.Counter()
        """Each waiting operation's name and the part that issued it, counted."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func not in UNCOUNTED and self.part is not None:
            viewing = func.is_view and func is not aten.lift_fresh.default
            (self.views if viewing else self.counts)[self.part] += 1
            if waits_for_device(func, args, kwargs):
                self.waits[self.part] += 1
                self.waiting_ops[f"{self.part}: {func}"] += 1
        return func(*args, **kwargs)

    def clear(self) -> None:
        self.counts.clear()
        self.views.clear()
        self.waits.clear()
        self.waiting_ops.clear()
