"""The constants of the generator's bits: splitmix64's increment and multipliers, the masks
that make int64's arithmetic right shift a logical one, and the Irwin-Hall normal's scale.

Shared by :mod:`difftest.generation.rng` (torch and numpy) and
:mod:`difftest.generation.fused_normals` (Triton); they are part of what every stored case
means, so they live in one place.
"""

from __future__ import annotations

GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
M2 = -7723592293110705685  # 0x94D049BB133111EB
MASK = {s: (1 << (64 - s)) - 1 for s in (30, 27, 31, 11, 48)}
"""``MASK[s]``: the low ``64 - s`` bits, kept after an arithmetic right shift by ``s``."""
NORMAL_SCALE = 3.0**0.5 / 65536.0
"""Four 16-bit uniforms summed have standard deviation 65536 / sqrt(3)."""
