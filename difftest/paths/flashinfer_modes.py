"""The production modes of the FlashInfer paths: which take ragged batches, which apply
``skip_softmax_threshold_scale_factor``, and how each is captured in a CUDA graph.

Read from FlashInfer 0.6.11 to 0.7.4 (``/work/research/facts.md``; checked in the unpacked
sources):

- **Ragged verify.** The context kernels take ragged queries natively (``cum_seq_lens_q``,
  ``max_q_len``, ``batch_size``), and so does the prefill wrapper (``qo_indptr``). The decode
  API's trtllm-gen branch takes the ragged form (``q_len_per_req=None``, ``max_q_len``,
  ``cum_seq_lens_q``); its XQA branch raises ``ValueError`` on it in every release
  (``decode.py``: "xqa backend does not support cum_seq_lens_q"), XQA's own ragged form being
  ``fi-xqa-ragged``. The decode wrapper plans one ``q_len_per_req`` for every request.
- **Skip-softmax.** Applied by the trtllm-gen decode and context kernels (any nonzero factor)
  and by FMHAv2's SM90 warp-specialised kernels (factor > 0; SM12x has no skip variants).
  Ignored by XQA (the decode API never forwards it), by fa2/fa3 (``paged_run`` takes it and
  drops it) and so by the tensor-core decode wrapper.
- **Graph capture.** XQA, trtllm-gen decode, the fa2/fa3 prefill wrapper and the decode
  wrapper are captured as SGLang captures them (:mod:`difftest.paths.flashinfer_graphs`); the
  context kernels are called again on the static buffers.

Importing this module attaches the modes to the registered paths (after the adapters, in
:data:`difftest.paths._BUILTIN`).
"""

from __future__ import annotations

import dataclasses

import torch

from difftest.model.case import Case
from difftest.paths import flashinfer_graphs as graphs
from difftest.paths.flashinfer_env import probe_env
from difftest.paths.modes import PathModes, SkipSoftmax, accepts
from difftest.paths.registry import get_path, register


def _xqa_ragged(case: Case, device: torch.device) -> str | None:
    return (
        "trtllm_batch_decode_with_kv_cache(backend='xqa') refuses max_q_len/cum_seq_lens_q "
        "(ValueError in every release 0.6.11-0.7.4): ragged batches reach XQA only through "
        "xqa_batch_decode_with_kv_cache(q_cu_seq_lens) (path fi-xqa-ragged)"
    )


def _decode_wrapper_ragged(case: Case, device: torch.device) -> str | None:
    return (
        "BatchDecodeWithPagedKVCacheWrapper plans one q_len_per_req for every request: "
        "no ragged batches"
    )


def _honours(case: Case, device: torch.device) -> SkipSoftmax:
    return "honours"


def _fmha_v2_skip(case: Case, device: torch.device) -> SkipSoftmax:
    """FMHAv2 generates skip-softmax kernels for its SM90 warp-specialised configs only."""
    env = probe_env(device)
    return "honours" if env.capability == (9, 0) else "ignores"


MODES: dict[str, PathModes] = {
    "fi-decode-xqa": PathModes(ragged=_xqa_ragged, capture=graphs.capture_trtllm_decode("xqa")),
    "fi-decode-trtllm-gen": PathModes(
        ragged=accepts, skip_softmax=_honours, capture=graphs.capture_trtllm_decode("trtllm-gen")
    ),
    "fi-context-trtllm-gen": PathModes(ragged=accepts, skip_softmax=_honours),
    "fi-context-fmha-v2": PathModes(ragged=accepts, skip_softmax=_fmha_v2_skip),
    "fi-prefill-fa2": PathModes(
        ragged=accepts,
        capture=graphs.capture_prefill("fa2"),
        capture_limits=graphs.prefill_capture_limits,
    ),
    "fi-prefill-fa3": PathModes(
        ragged=accepts,
        capture=graphs.capture_prefill("fa3"),
        capture_limits=graphs.prefill_capture_limits,
    ),
    "fi-decode-wrapper": PathModes(
        ragged=_decode_wrapper_ragged, capture=graphs.capture_decode_wrapper
    ),
}
"""Each FlashInfer path's modes (a path not listed keeps its own)."""


for _name, _modes in MODES.items():
    register(dataclasses.replace(get_path(_name), modes=_modes), replace=True)
