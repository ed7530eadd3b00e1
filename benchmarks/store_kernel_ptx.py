"""The fused store's kernel compiled for a GPU on any machine: its global stores, by dtype.

    python benchmarks/store_kernel_ptx.py [--arch 90] [--dim 128]

Triton's compiler needs no GPU to turn a kernel into PTX (its own ``ptxas`` assembles it).
This compiles :mod:`difftest.generation.fused_store`'s kernel for ``sm_<arch>`` with the
specialisations a campaign's launches get (the destination 16-byte aligned, its strides and
page size divisible by 16, the last stride 1), for each stored dtype, with ``DEST_ALIGNED``
on and off, and prints the store instructions its PTX holds and its float64 arithmetic: wide
stores (``st.global.v4.b32``) when a launch's segment offsets are multiples of 16 elements,
element stores when not, and no fused multiply-add (the torch form rounds each step; the
first-use check on a GPU would catch a difference). For reading: no assertion.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

DTYPES = ("*fp16", "*bf16", "*fp8e4nv", "*fp32")
ARRAYS = {
    "c0_ptr": "*i64",
    "c1_ptr": "*i64",
    "slot_ptr": "*i64",
    "factor_ptr": "*fp64",
    "base_ptr": "*fp64",
    "table_ptr": "*i64",
    "tiles_ptr": "*i64",
    "scale_ptr": "*fp64",
}
DIVISIBLE = ("out_ptr", "n", "page_size", "s_page", "s_pos", "s_head")
"""The arguments a campaign's launches specialise as divisible by 16 (or 16-byte aligned)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90, 100")
    parser.add_argument("--dim", type=int, default=128, help="head dim (sets the tile)")
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # compile for real, not for the interpreter
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from difftest.generation import fused_normals, fused_store

    if not fused_normals._have_triton():
        raise SystemExit("store_kernel_ptx: Triton is not installed")
    kernel = fused_store._build_kernel()
    names: list[str] = kernel.arg_names  # type: ignore[attr-defined]
    for aligned in (True, False):
        for dtype in DTYPES:
            constants = fused_store.constexprs(args.dim, aligned)
            constants["s_dim"] = 1  # Triton makes an integer argument equal to 1 a constant
            types = {**ARRAYS, "out_ptr": dtype}
            signature = {n: types.get(n, "constexpr" if n in constants else "i32") for n in names}
            attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in DIVISIBLE}
            source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
            ptx = triton.compile(source, target=GPUTarget("cuda", args.arch, 32)).asm["ptx"]
            stores = sorted(set(re.findall(r"st\.global[\w.]*", ptx)))
            arithmetic = collections.Counter(
                re.findall(r"\b(?:fma|mul|add|sub|div)\.[\w.]*f64", ptx)
            )
            label = "aligned" if aligned else "unaligned"
            print(
                f"sm_{args.arch} D={args.dim} {dtype[1:]:8s} {label:9s} stores {stores}; "
                f"float64 {dict(arithmetic)}"
            )


if __name__ == "__main__":
    main()
