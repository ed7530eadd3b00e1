"""The fused oracle's kernels compiled for a GPU on any machine, each variant a campaign builds.

    python tests/unit/_oracle_ptx.py [--arch 90] [--dims 128] [--rounding float64,float32]

Triton's compiler needs no GPU to turn a kernel into PTX. This compiles
:mod:`difftest.oracle.fused_kernels`' kernels (the two passes and the one pass) for ``sm_<arch>`` as
:func:`difftest.oracle.fused.paged_attention` launches them (the block sizes and warps of
:func:`difftest.oracle.fused.block_sizes` for each head dim, every way the cache is read:
natively, bf16 bits, fp8 bits; float64 and the float32 roundings; each step kernel with
``ALIGNED`` on, the cache's pointers then 16-byte aligned, and off), and prints one JSON line a
variant: whether it compiled (else the error's last line), the products' instructions its PTX
holds and how many of its reads of global memory are 16 bytes wide. Exit status 1 if any
variant failed to compile. Run in a process of its own, without ``TRITON_INTERPRET``
(``tests/unit/test_oracle_kernels_compile.py`` does): under the interpreter a kernel is not
compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

RAW_CACHE = {0: "*fp64", 1: "*i16", 2: "*u8"}
"""The cache pointer's type for each way the kernels read it (fused._KINDS): natively (here
float64; float16 and float32 read the same way), bf16 as int16 bits, fp8 e4m3 as uint8 bits."""

COMPUTED = ("q_ptr", "sink_ptr", "m_part_ptr", "l_part_ptr", "acc_part_ptr", "out_ptr")
"""Pointers to tensors in the compute dtype."""

VARIANTS: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("maxima", "maxima", {}),
    ("sums", "sums", {}),
    ("online", "online", {}),
    ("online-lanes2", "online_lanes", {"LANES": 2}),
    ("online-lanes4", "online_lanes", {"LANES": 4}),
    ("online-lanes8", "online_lanes", {"LANES": 8}),
    ("combine", "combine", {"RESCALE": 0}),
    ("combine-rescaled", "combine", {"RESCALE": 1}),
)
"""The variants by the name a line reports, their kernel and the compile-time settings that
tell them apart: the two passes' steps, the one pass (float64 only; with 2, 4 or 8 lanes a
program where a KV head has few rows) and the combine after each (``RESCALE`` after the one
pass)."""

ONE_PASS = ("online", "online_lanes")
"""The kernels of the one pass: float64 alone."""

PRODUCTS = r"mma\.[\w.]*|wgmma\.[\w.]*|fma\.rn\.f(?:32|64)"

WIDE_READ = (
    r"cp\.async\.cg\.shared\.global(?:\.L2::\w+)? \[[^]]*\], \[[^]]*\], 0x10"
    r"|ld\.global(?:\.\w+)*\.(?:v4\.b32|v2\.b64)"
)
"""A 16-byte read of global memory in PTX: an asynchronous copy of 16 bytes, or a vector load
of four 32-bit or two 64-bit words."""


def signature(
    kernel: object,
    f32: int,
    kind: int,
    d: int,
    settings: dict[str, int] | None = None,
    aligned: int = 1,
) -> tuple[dict, dict, dict, dict]:
    """The kernel's argument types, its compile-time constants, its compile options (warps,
    and a float64 step's pipeline depth where :func:`~difftest.oracle.fused.block_sizes`
    sets one) and its arguments' attributes, as :func:`difftest.oracle.fused.paged_attention`
    launches it for head dim ``d`` (``settings``: the variant's own constants, as
    :data:`VARIANTS` gives them; ``aligned``: a step kernel's ``ALIGNED``, the cache's
    pointers then 16-byte aligned, as Triton specialises them)."""
    from difftest.oracle.fused import BLOCK_M, KEYS_PER_ITEM, block_sizes
    from difftest.oracle.fused_kernels import CACHE_POINTERS

    names: list[str] = kernel.arg_names  # type: ignore[attr-defined]
    blocks = block_sizes(d)
    constants: dict[str, int] = {"BLOCK_M": BLOCK_M, "BLOCK_D": blocks.d}
    if "F32" in names:  # not the one pass: float64 alone
        constants["F32"] = f32
    constants.update(settings or {})
    options: dict[str, int] = {"num_warps": blocks.warps}
    if "KIND" in names:  # the two step kernels
        constants.update(
            KIND=kind,
            BLOCK_N=blocks.n32 if f32 else blocks.n,
            KEYS=KEYS_PER_ITEM,
            OPAQUE=1,
            ALIGNED=aligned,
        )
        if f32:
            options["num_warps"] = blocks.warps32
        elif blocks.stages is not None:
            options["num_stages"] = blocks.stages
    computed = "*fp32" if f32 else "*fp64"
    types: dict[str, str] = {}
    for name in names:
        if name in constants:
            types[name] = "constexpr"
        elif name in COMPUTED:
            types[name] = computed
        elif name in ("k_ptr", "v_ptr"):
            types[name] = RAW_CACHE[kind]
        elif name in ("draft_ptr", "colseen_ptr"):
            types[name] = "*u8"
        elif name.endswith("_ptr"):
            types[name] = "*i64"
        elif name.endswith("_bits"):
            types[name] = "i64"
        else:
            types[name] = "i32"
    attrs = {}
    if "ALIGNED" in constants and aligned:
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in CACHE_POINTERS}
    return types, constants, options, attrs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dims", default="128", help="head dims, comma-separated")
    parser.add_argument("--rounding", default="float64,float32")
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    from difftest.oracle import fused_kernels

    failed = 0
    for rounding in args.rounding.split(","):
        f32 = int(rounding == "float32")
        for d in (int(x) for x in args.dims.split(",")):
            for kind in RAW_CACHE:
                for name, function, settings in VARIANTS:
                    if function == "combine" and kind:
                        continue  # combine reads no cache: one variant a rounding and dim
                    if (function in ONE_PASS or settings.get("RESCALE")) and f32:
                        continue  # the one pass is float64 alone
                    kernel = getattr(fused_kernels, function)
                    # every step kernel aligned and not; the lanes aligned only (their
                    # element-wise reads are the same code as ``online``'s: fewer compiles)
                    both = function in ("maxima", "sums", "online")
                    for aligned in (1, 0) if both else (1,):
                        failed += not report(kernel, name, rounding, f32, kind, d, settings,
                                             aligned, args.arch)  # fmt: skip
    return 1 if failed else 0


def report(
    kernel: object,
    name: str,
    rounding: str,
    f32: int,
    kind: int,
    d: int,
    settings: dict[str, int],
    aligned: int,
    arch: int,
) -> bool:
    """Compile one variant and print its line; whether it compiled."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    types, constants, options, attrs = signature(kernel, f32, kind, d, settings, aligned)
    line: dict[str, object] = dict(
        kernel=name, rounding=rounding, kind=kind, dim=d, warps=options["num_warps"],
        stages=options.get("num_stages"), aligned=aligned,
    )  # fmt: skip
    try:
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=types, constexprs=constants, attrs=attrs),
            target=GPUTarget("cuda", arch, 32),
            options=options,
        )
    except Exception as exc:  # reported; the exit status says so
        last = str(exc).strip().splitlines() or [type(exc).__name__]
        line.update(ok=False, error=f"{type(exc).__name__}: {last[-1][:300]}")
    else:
        ptx = compiled.asm["ptx"]
        line.update(
            ok=True,
            products=sorted(set(re.findall(PRODUCTS, ptx))),
            wide_reads=len(re.findall(WIDE_READ, ptx)),
        )
    print(json.dumps(line), flush=True)
    return bool(line["ok"])


if __name__ == "__main__":
    sys.exit(main())
