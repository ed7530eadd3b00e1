"""What the installed FlashInfer release's API looks like, read from the library itself.

Every fact here comes from a signature (``inspect.signature`` of a function or method) or a
probe of what a module or class defines, never from the version number: a patched build, a
backport or a release difftest has not seen is described by what it actually has. The facts
(``docs/versions.md`` lists them with the releases that have each):

- where ``BatchDecodeWithPagedKVCacheWrapper`` takes ``q_len_per_req``: ``plan()`` (directly or
  through the keyword-only ``_plan_impl`` that ``plan(**kwargs)`` forwards to) or ``run()``;
- how that wrapper reports the backend its last ``plan()`` resolved: the ``resolved_backend``
  property, else the private ``_backend`` attribute the tensor-core plan rewrites;
- whether ``trtllm_batch_context_with_kv_cache`` takes ``backend=`` (then the adapter pins it);
- whether ``trtllm_fmha_v2_prefill`` accepts a paged ``(k_cache, v_cache)`` tuple with
  ``[B, 2, M]`` block offsets (probed by the validation helper that form goes through,
  ``flashinfer.prefill._check_paged_kv_non_interleaved``; the signature did not change);
- whether the explicit-only ``cake`` backend exists
  (``flashinfer.cake_batch_decode_with_kv_cache``).

:func:`detect` reads a module-like object, so the CPU tests run it on stand-ins built from the
recorded signatures of real releases (``tests/data/flashinfer_api/``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

QLenArg = Literal["plan", "run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashInferApi:
    """The API facts the adapters act on. The defaults are the oldest shape difftest supports
    (no optional feature), so an environment without a detected API claims nothing."""

    decode_qlen_arg: QLenArg | None = "run"
    """Where ``BatchDecodeWithPagedKVCacheWrapper`` takes ``q_len_per_req`` (``None``: nowhere)."""
    decode_wrapper_reports: Literal["resolved_backend", "_backend"] = "_backend"
    """The attribute a decode wrapper's resolved backend is read from after ``plan()``."""
    context_backend_arg: bool = False
    """``trtllm_batch_context_with_kv_cache`` takes ``backend=``."""
    fmha_v2_split_kv: bool = False
    """``trtllm_fmha_v2_prefill`` takes a paged ``(k_cache, v_cache)`` tuple with ``[B, 2, M]``
    block offsets."""
    cake: bool = False
    """The explicit-only ``cake`` backend of the TRT-LLM decode API exists."""

    def describe(self) -> str:
        """One line, for ``difftest paths`` and the environment stamp."""
        qlen = f"q_len_per_req at {self.decode_qlen_arg}()" if self.decode_qlen_arg else "no q_len"
        parts = [
            f"decode wrapper: {qlen}, backend read from {self.decode_wrapper_reports}",
            "context backend=" + ("pinned" if self.context_backend_arg else "absent"),
            "FMHAv2 (k, v) tuple: " + ("yes" if self.fmha_v2_split_kv else "no"),
            "cake: " + ("yes" if self.cake else "no"),
        ]
        return "; ".join(parts)


def parameters(fn: Any) -> frozenset[str]:
    """The parameter names of ``fn`` (empty when it is missing or has no signature)."""
    if fn is None:
        return frozenset()
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def decode_qlen_arg(decode_wrapper: Any) -> QLenArg | None:
    """Where this release's decode wrapper class takes ``q_len_per_req``."""
    planners = (
        inspect.getattr_static(decode_wrapper, "_plan_impl", None),
        getattr(decode_wrapper, "plan", None),
    )
    if any("q_len_per_req" in parameters(fn) for fn in planners):
        return "plan"
    if "q_len_per_req" in parameters(getattr(decode_wrapper, "run", None)):
        return "run"
    return None


def reports_resolved_backend(decode_wrapper: Any) -> bool:
    """Whether the decode wrapper class has the ``resolved_backend`` property."""
    return isinstance(inspect.getattr_static(decode_wrapper, "resolved_backend", None), property)


def resolved_backend(wrapper: Any) -> str | None:
    """The backend a planned wrapper says it resolved: ``resolved_backend`` where the class has
    it, else the ``_backend`` attribute (``None``: neither)."""
    if reports_resolved_backend(type(wrapper)):
        return str(wrapper.resolved_backend)
    backend = getattr(wrapper, "_backend", None)
    return None if backend is None else str(backend)


def takes_split_kv(prefill: Any) -> bool:
    """Whether this ``flashinfer.prefill``'s ``trtllm_fmha_v2_prefill`` takes a paged
    ``(k_cache, v_cache)`` tuple: it validates that form with ``_check_paged_kv_non_interleaved``
    (the releases before it refuse anything but one ``[pages, 2, ...]`` tensor)."""
    return callable(getattr(prefill, "_check_paged_kv_non_interleaved", None))


def _attr(module: Any, *names: str) -> Any:
    for name in names:
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


def detect(flashinfer: Any) -> FlashInferApi:
    """The API facts of ``flashinfer`` (the imported package, or a stand-in with the same
    attributes: ``decode``, ``prefill``, the wrapper classes)."""
    decode_wrapper = getattr(flashinfer, "BatchDecodeWithPagedKVCacheWrapper", None)
    context: Callable[..., Any] | None = _attr(
        flashinfer, "prefill", "trtllm_batch_context_with_kv_cache"
    )
    return FlashInferApi(
        decode_qlen_arg=decode_qlen_arg(decode_wrapper) if decode_wrapper is not None else None,
        decode_wrapper_reports=(
            "resolved_backend"
            if decode_wrapper is not None and reports_resolved_backend(decode_wrapper)
            else "_backend"
        ),
        context_backend_arg="backend" in parameters(context),
        fmha_v2_split_kv=takes_split_kv(getattr(flashinfer, "prefill", None)),
        cake=callable(getattr(flashinfer, "cake_batch_decode_with_kv_cache", None)),
    )
