"""Model presets: the attention configurations that matter, per tensor-parallel rank.

From docs/semantics.md §5. Each preset lists the ``(H_q, H_kv)`` pairs one rank sees across the
tensor-parallel degrees the model is served at, its head dim, and whether it uses a sliding
window (on alternate layers, so both ``-1`` and the window occur) and sinks.
"""

from __future__ import annotations

from dataclasses import dataclass

from difftest.model.errors import DifftestError


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    name: str
    heads: tuple[tuple[int, int], ...]
    """``(num_qo_heads, num_kv_heads)`` per rank, TP1 first."""
    head_dim: int
    windows: tuple[int, ...] = (-1,)
    """``window_left`` values its layers use (``-1``: full attention)."""
    sinks: bool = False
    page_sizes: tuple[int, ...] = (16, 32, 64)
    q_dtypes: tuple[str, ...] = ("bf16", "fp16")
    """Query (and output) dtypes drawn; the KV cache is the query dtype or, with
    :attr:`fp8_kv`, fp8 e4m3 too."""
    fp8_kv: bool = True
    notes: str = ""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="llama-3.1-8b",
            heads=((32, 8), (16, 4), (8, 2), (4, 1)),
            head_dim=128,
            notes="EAGLE3; TP1..TP8",
        ),
        Preset(
            name="llama-3.3-70b",
            heads=((64, 8), (32, 4), (16, 2), (8, 1)),
            head_dim=128,
            notes="EAGLE3; TP1..TP8",
        ),
        Preset(
            name="qwen3.5-397b-a17b",
            heads=((32, 2), (16, 1), (8, 1), (4, 1)),
            head_dim=256,
            notes="MTP; the production crash; one KV head per rank at TP>=2",
        ),
        Preset(name="qwen3-next-80b", heads=((16, 2), (8, 1)), head_dim=256, notes="MTP"),
        Preset(
            name="gpt-oss-120b",
            heads=((64, 8), (32, 4), (16, 2), (8, 1)),
            head_dim=64,
            windows=(-1, 127),
            sinks=True,
            notes="EAGLE3; window 128 on alternate layers",
        ),
    )
}


XQA_TEST_SHAPE = Preset(
    name="flashinfer-xqa-test",
    heads=((8, 4),),
    head_dim=128,
    windows=(-1, 127),
    sinks=True,
    page_sizes=(64,),
    q_dtypes=("bf16",),
    fp8_kv=False,
    notes="the first shape of FlashInfer's test_xqa_batch_decode (bf16); not a model, so not "
    "in PRESETS: the small limits (difftest.generation.strategies.SMALL_LIMITS) fix it",
)
"""FlashInfer's ``test_xqa_batch_decode`` shape: 4 KV heads, group 2, head dim 128, pages of 64,
bf16, with and without a window of 127 and sinks."""


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise DifftestError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
