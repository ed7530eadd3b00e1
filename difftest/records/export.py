"""Standalone export: a Python script that reproduces a finding with torch and the kernel
library alone (no difftest import), for filing upstream.

The script embeds the materialised batch (raw bytes, base64, with dtype and shape; the KV cache
as the exact strided view the path received), the float64 oracle's output and each request's
tolerance, and the *source* of everything it runs: the case and batch classes, the oracle, and
the kernel call. For a path written in Python (the CPU paths, plugins) the call is the path's
own run function, copied with every helper it uses; for a FlashInfer path it is the FlashInfer
call built by the adapter's argument builder from :mod:`difftest.paths.kernel_args`. The script
prints one line per wrong request and ``PASS`` or ``FAIL`` last (exit 0 or 1).

Copying code, not importing it, is :mod:`difftest.records.source_bundle`'s job: the definitions a
function needs are found through its module's syntax tree, project code is copied (in
dependency order), installed packages are imported.
"""

from __future__ import annotations

import base64
import importlib
import json
import pprint
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch

from difftest.generation.materialize import materialize
from difftest.judgement import tolerance as compare
from difftest.model.batch import Batch
from difftest.model.errors import DifftestError
from difftest.paths import kernel_args
from difftest.paths.registry import KernelPath, get_path
from difftest.records.repro import Repro
from difftest.records.source_bundle import Bundle

MAX_EMBEDDED_BYTES = 32 << 20
"""Tensors larger than this in total are not embedded: shrink the repro first."""


class ExportError(DifftestError):
    """A repro cannot be exported as a standalone script (the message says why)."""


_WORKSPACE = (
    "    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=batch.device)\n"
)


_FI_HELPER_MODULES = (
    "difftest.paths.flashinfer_env",
    "difftest.paths.flashinfer_decode",
    "difftest.paths.flashinfer_wrappers",
)


def _fi(name: str) -> tuple[str, Any]:
    """A helper the FlashInfer adapters share, from the module that defines it."""
    for module_name in _FI_HELPER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found = getattr(module, name, None)
        if callable(found):
            return name, sys.modules[found.__module__]
    raise ExportError(f"the FlashInfer adapters no longer define {name!r}: export needs updating")


def _recipes() -> dict[str, tuple[list[tuple[str, Any]], str]]:
    """FlashInfer paths: the names to copy and the ``kernel(batch)`` that calls FlashInfer as
    the adapter does (``difftest/paths/flashinfer_*.py``)."""
    ka = kernel_args
    decode = [("decode_kwargs", ka), ("WORKSPACE_BYTES", ka), _fi("call_accepting")]
    context = [("context_kwargs", ka), ("WORKSPACE_BYTES", ka), _fi("call_accepting")]
    fmha = [("fmha_v2_kwargs", ka), ("WORKSPACE_BYTES", ka), _fi("call_accepting")]
    wrappers = [("wrapper_kv", ka), ("prefill_plan_kwargs", ka), ("WORKSPACE_BYTES", ka)]
    decode_wrapper = [
        ("wrapper_kv", ka),
        ("decode_plan_kwargs", ka),
        ("WORKSPACE_BYTES", ka),
        _fi("_decode_qlen_arg"),
    ]

    def trtllm_decode(backend: str) -> str:
        return (
            "def kernel(batch):\n    import flashinfer.decode\n\n"
            + _WORKSPACE
            + f"    kwargs = decode_kwargs(batch, workspace, {backend!r})\n"
            "    fn = flashinfer.decode.trtllm_batch_decode_with_kv_cache\n"
            "    return call_accepting(fn, kwargs, set())\n"
        )

    def rows(builder: str, fn: str, optional: str) -> str:
        return (
            "def kernel(batch):\n    import flashinfer.prefill\n\n"
            + _WORKSPACE
            + f"    kwargs = {builder}(batch, workspace)\n"
            f"    out = call_accepting(flashinfer.prefill.{fn}, kwargs, {optional})\n"
            "    return out[: batch.case.batch.num_query_rows]\n"
        )

    def prefill(backend: str) -> str:
        return (
            "def kernel(batch):\n    import flashinfer\n\n"
            + _WORKSPACE
            + "    kv, layout = wrapper_kv(batch)\n"
            "    v_scale = None if batch.bmm2_scale == 1.0 else batch.bmm2_scale\n"
            "    a = batch.case.attention\n"
            "    if batch.sinks is None:\n"
            "        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(\n"
            f"            workspace, layout, backend={backend!r}\n        )\n"
            "        wrapper.plan(**prefill_plan_kwargs(batch))\n"
            "        return wrapper.run(batch.q, kv, out=batch.new_output(), v_scale=v_scale)\n"
            "    wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(\n"
            f"        workspace, kv_layout=layout, backend={backend!r},\n"
            "        q_data_type=batch.q.dtype, kv_data_type=batch.kv_cache.dtype,\n"
            "        head_dim_qk=a.head_dim, head_dim_vo=a.head_dim,\n"
            "        window_left=batch.window_left,\n"
            "    )\n"
            "    wrapper.plan(**prefill_plan_kwargs(batch))\n"
            "    return wrapper.run(\n"
            "        batch.q, kv, batch.sinks, batch.bmm1_scale, out=batch.new_output(),\n"
            "        v_scale=v_scale,\n    )\n"
        )

    wrapper_decode = (
        "def kernel(batch):\n    import flashinfer\n\n"
        + _WORKSPACE
        + "    kv, layout = wrapper_kv(batch)\n"
        "    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(\n"
        "        workspace, layout, use_tensor_cores=True, backend='fa2'\n    )\n"
        "    plan = decode_plan_kwargs(batch)\n"
        "    run = {'out': batch.new_output()}\n"
        "    run['v_scale'] = None if batch.bmm2_scale == 1.0 else batch.bmm2_scale\n"
        "    where = _decode_qlen_arg(flashinfer)\n"
        "    if where == 'plan':\n        plan['q_len_per_req'] = batch.q_len\n"
        "    elif batch.q_len > 1:\n        run['q_len_per_req'] = batch.q_len\n"
        "    wrapper.plan(**plan)\n"
        "    return wrapper.run(batch.q, kv, **run)\n"
    )
    return {
        "fi-decode-xqa": (decode, trtllm_decode("xqa")),
        "fi-decode-trtllm-gen": (decode, trtllm_decode("trtllm-gen")),
        "fi-context-trtllm-gen": (
            context,
            rows("context_kwargs", "trtllm_batch_context_with_kv_cache", "{'causal'}"),
        ),
        "fi-context-fmha-v2": (fmha, rows("fmha_v2_kwargs", "trtllm_fmha_v2_prefill", "set()")),
        "fi-prefill-fa2": (wrappers, prefill("fa2")),
        "fi-prefill-fa3": (wrappers, prefill("fa3")),
        "fi-decode-wrapper": (decode_wrapper, wrapper_decode),
    }


def _kernel_source(path: KernelPath, bundle: Bundle) -> tuple[str, str]:
    """``(kernel definition, default device)`` for ``path``; copies what it needs."""
    recipe = _recipes().get(path.name)
    if recipe is not None:
        names, body = recipe
        for name, module in names:
            bundle.require_name(name, module)
        return body, "cuda"
    run = path.run
    if not callable(run) or getattr(run, "__closure__", None) or run.__name__ == "<lambda>":
        raise ExportError(
            f"path {path.name!r}: its run function is a lambda or a closure; export needs a "
            "module-level function"
        )
    bundle.require_object(run)
    return f"def kernel(batch):\n    return {run.__name__}(batch)\n", "cpu"


def _blob(t: torch.Tensor) -> dict[str, Any]:
    cpu = t.detach().cpu().contiguous()
    data = cpu.view(torch.uint8).numpy().tobytes() if cpu.numel() else b""
    return {
        "dtype": str(cpu.dtype).removeprefix("torch."),
        "shape": list(cpu.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }


def _tensors(batch: Batch, ref: torch.Tensor) -> tuple[dict[str, Any], dict[str, Any]]:
    tensors = {
        "q_padded": batch.q_padded,
        "kv_storage": batch.kv_storage,
        "block_tables": batch.block_tables,
        "seq_lens": batch.seq_lens,
        "draft_mask": batch.draft_mask,
        "reference": ref,
    }
    if batch.sinks is not None:
        tensors["sinks"] = batch.sinks
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total > MAX_EMBEDDED_BYTES:
        raise ExportError(
            f"the case needs {total / 2**20:.1f} MiB of tensors (limit "
            f"{MAX_EMBEDDED_BYTES >> 20} MiB): shrink it first (difftest shrink FILE)"
        )
    cache, storage = batch.kv_cache, batch.kv_storage
    if cache.untyped_storage().data_ptr() != storage.untyped_storage().data_ptr():
        raise ExportError("the KV cache is not a view of the pool storage")
    view = {
        "size": list(cache.shape),
        "stride": list(cache.stride()),
        "offset": cache.storage_offset() - storage.storage_offset(),
    }
    return {k: _blob(t) for k, t in tensors.items()}, view


def _literal(name: str, value: Any) -> str:
    return f"{name} = {pprint.pformat(value, width=96, sort_dicts=False)}\n"


def _tensor_literals(blobs: dict[str, Any]) -> str:
    lines = ["TENSORS = {\n"]
    for key, blob in blobs.items():
        chunks = textwrap.wrap(blob["data"], 96) or [""]
        data = "".join(f"            {c!r}\n" for c in chunks)
        lines.append(
            f"    {key!r}: {{\n        'dtype': {blob['dtype']!r},\n"
            f"        'shape': {blob['shape']!r},\n        'data': (\n{data}        ),\n    }},\n"
        )
    lines.append("}\n")
    return "".join(lines)


def export_script(repro: Repro, device: torch.device | None = None) -> str:
    """The standalone script reproducing ``repro``'s finding (tensors built on ``device``,
    then embedded; CPU by default: materialisation is bitwise the same on every device)."""
    if repro.finding is None:
        raise ExportError("a pending repro has no finding to export")
    path = get_path(repro.finding.path)
    case = repro.case
    batch = materialize(case, device or torch.device("cpu"))
    tol = compare.Tolerance()  # the tool's rules, never the file's
    ref = compare.reference(batch)
    floor = compare.noise_floor(batch, ref, path.precision(case))
    bound = compare.request_bounds(batch, ref, floor, tol)
    blobs, view = _tensors(batch, ref)
    bundle = Bundle()
    kernel, default_device = _kernel_source(path, bundle)
    for name, module in (("Case", "difftest.model.case"), ("Batch", "difftest.model.batch")):
        bundle.require_name(name, module)
    bundle.require_name("reference", "difftest.judgement.tolerance")
    header = (
        f'"""Standalone reproduction of a difftest finding (generated by `difftest export`).\n\n'
        f"path: {path.name} ({path.description})\nfinding: {repro.finding.kind.value}: "
        f"{repro.finding.reason}\ncase: {case.digest()}\n"
        f"recorded on: {json.dumps(repro.environment.to_json(), sort_keys=True)}\n\n"
        "Needs torch (and the kernel library of the path); no difftest import. Run:\n"
        "    python this_script.py [--device cpu|cuda]\n"
        'Prints PASS or FAIL on its last line (exit code 0 or 1).\n"""\n\n'
        "from __future__ import annotations\n\nimport base64\nimport sys\n\n"
    )
    parts = [
        header,
        bundle.imports(),
        "\n\n# ---- copied from the difftest project and the path: what the run needs ----\n\n",
        bundle.source(),
        "\n\n# ---- the kernel call ----\n\n",
        kernel,
        "\n\n# ---- the case, its tensors and the expected result ----\n\n",
        _literal("CASE", case.to_json()),
        _literal("KV_CACHE_VIEW", view),
        _literal("BOUNDS", [float(b) for b in bound.cpu()]),
        f"DEFAULT_DEVICE = {default_device!r}\n",
        _tensor_literals(blobs),
        _MAIN,
    ]
    return "".join(parts)


def write_script(repro: Repro, file: Path) -> Path:
    from difftest.records.atomic import write_text

    return write_text(file, export_script(repro))


_MAIN = """

def tensor(name: str, device: str) -> torch.Tensor:
    spec = TENSORS[name]
    raw = base64.b64decode("".join(spec["data"]))
    dtype = getattr(torch, spec["dtype"])
    if not raw:
        return torch.empty(spec["shape"], dtype=dtype, device=device)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return flat.view(dtype).reshape(spec["shape"]).to(device)


def main() -> int:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else DEFAULT_DEVICE
    case = Case.from_json(CASE)
    storage = tensor("kv_storage", device)
    view = KV_CACHE_VIEW
    batch = Batch(
        case=case,
        device=torch.device(device),
        q_padded=tensor("q_padded", device),
        kv_storage=storage,
        kv_cache=storage.as_strided(view["size"], view["stride"], view["offset"]),
        block_tables=tensor("block_tables", device),
        seq_lens=tensor("seq_lens", device),
        sinks=tensor("sinks", device) if "sinks" in TENSORS else None,
        draft_mask=tensor("draft_mask", device),
    )
    expected = tensor("reference", device)
    recomputed = reference(batch)
    drift = float((recomputed - expected).abs().max()) if expected.numel() else 0.0
    print(f"oracle recomputed here: max |diff| from the embedded reference {drift:.3g}")
    out = kernel(batch)
    rows, L = case.batch.num_query_rows, case.batch.q_len
    if tuple(out.shape) != tuple(expected.shape):
        print(f"FAIL: output shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
        return 1
    err = torch.nan_to_num((out.double() - expected).abs(), nan=float("inf"))
    per_request = err.reshape(len(BOUNDS), -1).amax(dim=1).tolist()
    wrong = 0
    for b, (e, bound) in enumerate(zip(per_request, BOUNDS)):
        if not e <= bound:
            wrong += 1
            bad = (err[b * L : (b + 1) * L] > bound).nonzero().tolist()
            rows_bad = sorted({r for r, _, _ in bad})
            heads_bad = sorted({h for _, h, _ in bad})
            where = f"rows {rows_bad}, heads {heads_bad}"
            print(f"request {b}: max |err| {e:.4g} > bound {bound:.4g} ({where})")
    if wrong:
        print(f"FAIL: {wrong} of {len(BOUNDS)} requests over tolerance")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
"""
