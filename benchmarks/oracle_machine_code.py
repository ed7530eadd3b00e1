"""The fused oracle's float64 steps as machine code, on any machine with Triton: a static proxy
for their device time.

    python benchmarks/oracle_machine_code.py [--arch 90] [--dims 16,64,128,256]
        [--kernels online,online_lanes,maxima,sums] [--kinds 0,1,2] [--lanes 2,4,8]

The GPU is lent rarely; a change to a kernel's shape can be judged first by the code it
compiles to. This compiles :mod:`difftest.oracle.fused_kernels`' float64 step kernels for
``sm_<arch>`` as a campaign launches them (``tests/unit/_oracle_ptx.py``'s signatures: the
block sizes of :func:`difftest.oracle.fused.block_sizes`, the cache read natively (0), as bf16
bits (1) or as fp8 bits (2), ``ALIGNED`` on; a native cache as float16, the one a campaign
draws) with the compiler Triton ships, and prints a line
a variant: registers a thread and local memory (spilled registers) from the binary's resource
usage, and the step loop's length, the longest backward branch's span in the disassembly,
in instructions and in instructions a key (the loop handles ``BLOCK_N`` keys of
``BLOCK_M`` rows a pass; ``online_lanes`` handles them for each of its ``--lanes`` (item, KV
head) pairs, and its "a key" is a lane's share). The kernels are latency-bound (docs/validation.md, Run 41), so
these are a proxy, not a time: a shape that doubles the loop's instructions a key is not
worth a device call; one that halves them is. Needs Triton's ``cuobjdump`` (its wheel has
it). No assertion: for reading. Exit status 1 if a variant failed to compile.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;", re.MULTILINE)
"""One SASS instruction in ``cuobjdump -sass``'s listing: its address, its text."""


def step_loop(sass: str) -> int:
    """Instructions in the longest loop of the listing: the span of the backward branch that
    covers the most (a step kernel's loop over its keys; 0 if there is none)."""
    listing = [(int(a, 16), text) for a, text in INSTRUCTION.findall(sass)]
    index = {address: i for i, (address, _) in enumerate(listing)}
    longest = 0
    for i, (address, text) in enumerate(listing):
        branch = re.search(r"\bBRA\s+0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            target = index.get(int(branch.group(1), 16))
            if target is not None:
                longest = max(longest, i - target + 1)
    return longest


def resources(cuobjdump: Path, cubin: bytes) -> tuple[int, int, str]:
    """Registers a thread, local memory bytes, and the SASS listing of one binary."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "kernel.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sass = subprocess.run(
            [str(cuobjdump), "-sass", str(path)], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    return int(regs.group(1)) if regs else -1, int(local.group(1)) if local else -1, sass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dims", default="16,64,128,256", help="head dims, comma-separated")
    parser.add_argument("--kernels", default="online,online_lanes,maxima,sums")
    parser.add_argument("--kinds", default="0,1,2", help="0 native, 1 bf16 bits, 2 fp8 bits")
    parser.add_argument("--lanes", default="2,4,8", help="online_lanes's lanes a program")
    args = parser.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # compile for real
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        print("oracle_machine_code: Triton is not installed", file=sys.stderr)
        return 2
    import _oracle_ptx

    from difftest.oracle import fused_kernels

    nvidia = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    cuobjdump = nvidia / "cuobjdump"
    if not cuobjdump.exists():
        print(f"oracle_machine_code: no cuobjdump at {cuobjdump}", file=sys.stderr)
        return 2
    print(f"sm_{args.arch}, Triton {triton.__version__}, float64 steps, ALIGNED on")
    print(
        f"{'kernel':>12} {'lanes':>5} {'kind':>4} {'dim':>4} {'rows':>4} {'keys':>4} "
        f"{'regs':>4} {'local':>5} {'loop':>5} {'a key':>6}"
    )
    failed = 0
    for name in args.kernels.split(","):
        kernel = getattr(fused_kernels, name)
        counts = [int(n) for n in args.lanes.split(",")] if name == "online_lanes" else [1]
        for kind in (int(k) for k in args.kinds.split(",")):
            for d in (int(x) for x in args.dims.split(",")):
                for lanes in counts:
                    settings = {"LANES": lanes} if name == "online_lanes" else {}
                    types, constants, options, attrs = _oracle_ptx.signature(
                        kernel, 0, kind, d, settings
                    )
                    if kind == 0:  # read natively: as a campaign's float16 caches are
                        types.update(k_ptr="*fp16", v_ptr="*fp16")
                    source = ASTSource(
                        fn=kernel, signature=types, constexprs=constants, attrs=attrs
                    )
                    label = f"{name:>12} {lanes:>5} {kind:>4} {d:>4}"
                    try:
                        compiled = triton.compile(
                            source, target=GPUTarget("cuda", args.arch, 32), options=options
                        )
                    except Exception as exc:  # reported; the exit status says so
                        failed += 1
                        print(f"{label}  failed: {str(exc).splitlines()[-1][:200]}")
                        continue
                    regs, local, sass = resources(cuobjdump, compiled.asm["cubin"])
                    loop = step_loop(sass)
                    keys = int(constants["BLOCK_N"])
                    print(
                        f"{label} {constants['BLOCK_M']:>4} {keys:>4} {regs:>4} {local:>5} "
                        f"{loop:>5} {loop / keys / lanes:>6.1f}",
                        flush=True,
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
