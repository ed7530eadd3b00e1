"""Standalone export: a Python script that reproduces a finding with torch and the kernel
library alone (no difftest import), for filing upstream.

The script embeds the materialised batch (raw bytes, base64, with dtype and shape; the KV cache
as the exact strided view the path received), the float64 oracle's output and each request's
tolerance, and the *source* of everything it runs: the case and batch classes, the oracle, the
per-request judgement (:func:`~difftest.judgement.tolerance.judge`), and the kernel call. The
kernel call is the path's own code, copied with every helper it uses: its ``standalone``
function where it has one (every FlashInfer path: the adapter's kernel call, with a new
workspace and no contract checks), else its ``run`` function (the CPU paths, plugins). The
script prints one line per wrong request and ``PASS`` or ``FAIL`` with difftest's verdict
last (exit 0 or 1).

Copying code, not importing it, is :mod:`difftest.records.source_bundle`'s job: the definitions a
function needs are found through its module's syntax tree, project code is copied (in
dependency order), installed packages are imported.
"""

from __future__ import annotations

import base64
import json
import pprint
from pathlib import Path
from typing import Any

import torch

from difftest.generation.materialize import materialize
from difftest.judgement import tolerance as compare
from difftest.model.batch import DTYPES, Batch
from difftest.model.case import Case
from difftest.model.errors import DifftestError
from difftest.paths.registry import KernelPath, get_path
from difftest.records.repro import Repro
from difftest.records.source_bundle import Bundle
from difftest.records.untrusted import check_fits

MAX_EMBEDDED_BYTES = 32 << 20
"""Tensors larger than this in total are not embedded: shrink the repro first."""


class ExportError(DifftestError):
    """A repro cannot be exported as a standalone script (the message says why)."""


def _kernel_source(path: KernelPath, bundle: Bundle) -> str:
    """The script's ``kernel(batch)``: the path's standalone run function (or its run
    function), copied into ``bundle`` with everything it calls."""
    run = path.standalone or path.run
    if not callable(run) or getattr(run, "__closure__", None) or run.__name__ == "<lambda>":
        raise ExportError(
            f"path {path.name!r}: its run function is a lambda or a closure; export needs a "
            "module-level function"
        )
    bundle.require_object(run)
    return f"def kernel(batch):\n    return {run.__name__}(batch)\n"


def _default_device(path: KernelPath) -> str:
    """Where the script runs unless told: on a CPU if the path runs there, else CUDA."""
    return "cpu" if path.availability(torch.device("cpu")) is None else "cuda"


def _blob(t: torch.Tensor) -> dict[str, Any]:
    cpu = t.detach().cpu().contiguous()
    data = cpu.view(torch.uint8).numpy().tobytes() if cpu.numel() else b""
    return {
        "dtype": str(cpu.dtype).removeprefix("torch."),
        "shape": list(cpu.shape),
        "data": base64.b64encode(data).decode("ascii"),
    }


def embedded_bytes(case: Case) -> int:
    """The bytes the script would embed for ``case``, from its spec alone (the pool at the
    KV dtype, the float64 reference and the queries; the page table and lengths are
    small): refused past :data:`MAX_EMBEDDED_BYTES` before anything is materialised."""
    a = case.attention
    kv = DTYPES[a.kv_dtype].itemsize
    rows = case.batch.num_query_rows
    queries = (rows + case.batch.padding_rows) * a.num_qo_heads * a.head_dim
    return case.pool_elements() * kv + rows * a.num_qo_heads * a.head_dim * 8 + queries * 2


def _too_large(total: int) -> ExportError:
    return ExportError(
        f"the case needs {total / 2**20:.1f} MiB of tensors (limit "
        f"{MAX_EMBEDDED_BYTES >> 20} MiB): shrink it first (difftest shrink FILE)"
    )


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
        raise _too_large(total)
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
        text = blob["data"]  # one base64 word: slices (textwrap takes minutes on 40 MB)
        chunks = [text[i : i + 96] for i in range(0, len(text), 96)] or [""]
        data = "".join(f"            {c!r}\n" for c in chunks)
        lines.append(
            f"    {key!r}: {{\n        'dtype': {blob['dtype']!r},\n"
            f"        'shape': {blob['shape']!r},\n        'data': (\n{data}        ),\n    }},\n"
        )
    lines.append("}\n")
    return "".join(lines)


def export_script(
    repro: Repro, device: torch.device | None = None, *, source: str = "repro"
) -> str:
    """The standalone script reproducing ``repro``'s finding (tensors built on ``device``,
    then embedded; CPU by default: materialisation is bitwise the same on every device).
    A case whose tensors are past :data:`MAX_EMBEDDED_BYTES`, or past the memory the device
    has free, is refused (naming ``source``) before anything is materialised."""
    if repro.finding is None:
        raise ExportError("a pending repro has no finding to export")
    path = get_path(repro.finding.path)
    case = repro.case
    if embedded_bytes(case) > MAX_EMBEDDED_BYTES:  # before materialising it: a file asks
        raise _too_large(embedded_bytes(case))
    device = device or torch.device("cpu")
    check_fits(case, device, source)
    batch = materialize(case, device)
    tol = compare.Tolerance()  # the tool's rules, never the file's
    ref = compare.reference(batch)
    floor = compare.noise_floor(batch, ref, path.precision(case))
    bound = compare.request_bounds(batch, ref, floor, tol)
    blobs, view = _tensors(batch, ref)
    bundle = Bundle()
    kernel = _kernel_source(path, bundle)
    for name, module in (("Case", "difftest.model.case"), ("Batch", "difftest.model.batch")):
        bundle.require_name(name, module)
    for name in ("reference", "judge"):
        bundle.require_name(name, "difftest.judgement.tolerance")
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
        f"PATH = {path.name!r}\n",
        f"DEFAULT_DEVICE = {_default_device(path)!r}\n",
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
    if tuple(out.shape) != tuple(expected.shape):
        print(f"FAIL: output shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
        return 1
    bounds = torch.tensor(BOUNDS, dtype=torch.float64, device=device)
    verdict = judge(PATH, batch, out, expected, bounds)
    for e in verdict.metrics.errors:  # the wrong requests, worst first
        error = f"max |err| {e.max_abs:.4g} > bound {e.bound:.4g}"
        print(f"request {e.request}: {error} (rows {list(e.rows)}, heads {list(e.heads)})")
    if verdict.outcome.is_finding:
        print(f"FAIL: {verdict.outcome.value}: {verdict.reason}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
"""
