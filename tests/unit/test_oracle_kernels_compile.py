"""The fused oracle's kernels compile for a GPU, and multiply in the precision they claim.

The CPU tests run the kernels under Triton's interpreter, which compiles nothing: a kernel can
be right there and fail to build on a GPU. The float32 roundings did, on an H100 and an H200
(Triton 3.6; docs/validation.md, Runs 33-34), and the fused noise floors were turned off.
Triton's compiler needs no GPU, so here every variant a campaign builds is compiled for sm90
(the H100 and H200) in a process of its own (``tests/unit/_oracle_ptx.py``; the interpreter is
on in this one), for four head dims (16 to 256), and its PTX read: the float64 oracle's
products are float64 instructions, the float32 roundings' never TF32 (a noise floor must not
see a 10-bit mantissa). The code before the float32 product with V was :func:`weighted32`
fails here with this machine's Triton (3.9) as it failed on the GPUs with 3.6.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_oracle_ptx.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="Triton is not installed: the fused oracle's kernels are compiled by Triton",
)


@pytest.fixture(scope="module")
def variants() -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default, said aloud (it warns otherwise)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--arch", "90", "--dims", "16,64,128,256"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no variant compiled or reported (exit {done.returncode}): {done.stderr[-2000:]}"
    failed = [v for v in lines if not v["ok"]]
    assert done.returncode == (1 if failed else 0), done.stderr[-2000:]
    return lines


def test_every_variant_compiles_for_sm90(variants: list[dict[str, object]]) -> None:
    """Both roundings, four head dims, every way the cache is read, the float64 oracle in
    two passes and in one (with 2, 4 and 8 lanes a program too), each step kernel with and
    without ``ALIGNED`` (the lanes with): 168 variants, all built."""
    failed = [
        (v["kernel"], v["rounding"], v["kind"], v["dim"], v["error"])
        for v in variants
        if not v["ok"]
    ]
    assert not failed
    # a head dim: float64 3 x (maxima, sums, online) x 2 + 3 x 3 lanes + 2 combines;
    # float32 3 x 2 x 2 + 1
    assert len(variants) == 4 * (29 + 13)
    assert {v["kernel"] for v in variants} >= {"online", "online-lanes8", "combine-rescaled"}


def test_products_are_in_the_rounding_they_claim(variants: list[dict[str, object]]) -> None:
    """The float64 steps multiply on float64 instructions only; the float32 steps use
    float32 (IEEE) instructions and no TF32 or lower-precision matrix instruction."""
    for v in variants:
        products = [str(p) for p in v["products"]]  # type: ignore[attr-defined]
        if v["kernel"].startswith("combine"):  # type: ignore[attr-defined]
            continue
        if v["rounding"] == "float64":
            assert products, v
            assert all(p.endswith("f64") for p in products), v
        else:
            assert "fma.rn.f32" in products, v
            assert not any(p.startswith(("mma", "wgmma")) for p in products), v


def test_aligned_caches_are_read_sixteen_bytes_at_a_time(
    variants: list[dict[str, object]],
) -> None:
    """With ``ALIGNED`` every float64 step kernel (the oracle each case runs) reads the cache
    in 16-byte pieces wherever a thread's share of a tile's row is that wide: the offsets'
    mark reaches the loads. At head dim 16 a step's 32 keys x 16 dims over 128 threads give a
    thread 4 values of a row, 8 bytes of bf16 and 4 of fp8, and nothing can be read 16 bytes
    at a time there. Without ``ALIGNED``, no read of global memory in any step kernel is that
    wide (nothing else they read is known to be aligned). The float32 floors' steps are not
    held to it: a step of theirs holds 8 keys at head dim 128 over 8 warps, so a thread's
    share of a bf16 row is 8 bytes. Elementwise reads made the bf16 one pass twice the
    instructions (docs/validation.md, Run 41)."""
    from difftest.oracle.fused import block_sizes

    width = {0: 8, 1: 2, 2: 1}  # bytes a value, by how the cache is read (RAW_CACHE)
    steps = [v for v in variants if not str(v["kernel"]).startswith("combine")]
    exact = [v for v in steps if v["rounding"] == "float64" and v["aligned"]]
    assert len(exact) == 4 * 3 * (3 + 3)  # (maxima, sums, online, its three lane counts)
    narrow = []
    for v in exact:
        blocks = block_sizes(int(v["dim"]))  # type: ignore[call-overload]
        share = min(blocks.d, blocks.n * blocks.d // (32 * blocks.warps))
        if share * width[int(v["kind"])] >= 16:  # type: ignore[call-overload]
            assert v["wide_reads"], v
        else:
            narrow.append((v["dim"], v["kind"]))
    assert sorted(set(narrow)) == [(16, 1), (16, 2)], narrow  # where the shares are computed
    for v in steps:
        if not v["aligned"]:
            assert v["wide_reads"] == 0, v
