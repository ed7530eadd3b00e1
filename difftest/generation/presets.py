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


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise DifftestError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
