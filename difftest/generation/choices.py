"""Where a drawn case's choices come from: Hypothesis, or a seeded plain-Python generator.

The case builders of :mod:`difftest.generation.strategies` and :mod:`difftest.generation.modes`
make every choice through a :class:`Choices`. Under Hypothesis (:class:`DrawnChoices`) each
choice is a draw, so cases shrink as Hypothesis shrinks them; a campaign's templates (its
compile variants) are drawn that way. A template's runtime variations and launch partners are
many per template and need no shrinking at draw time (difftest's own reducer shrinks a finding
from its case spec), so they come from :class:`SeededChoices`: Python's Mersenne Twister seeded
with an integer, about a microsecond a choice instead of Hypothesis's engine, and the same
cases on every machine, Python 3.x and Hypothesis version (``random.Random(seed)``'s integer
and float methods used here are stable across them).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


class Choices(Protocol):
    """A source of choices. Each shrinks toward its first or smallest option under Hypothesis."""

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``."""
        ...

    def pick(self, options: Sequence[T]) -> T:
        """One of ``options`` (not empty)."""
        ...

    def flag(self) -> bool:
        """A coin (``False`` first)."""
        ...

    def real(self, lo: float, hi: float) -> float:
        """A finite float in ``[lo, hi]``."""
        ...


class DrawnChoices:
    """Choices drawn by Hypothesis (inside a ``@st.composite`` or a test)."""

    __slots__ = ("_draw",)

    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def pick(self, options: Sequence[T]) -> T:
        return self._draw(st.sampled_from(options))

    def flag(self) -> bool:
        return self._draw(st.booleans())

    def real(self, lo: float, hi: float) -> float:
        return self._draw(
            st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
        )


class SeededChoices:
    """Choices from ``random.Random(seed)``: cheap and deterministic."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        if hi < lo:
            raise ValueError(f"empty range [{lo}, {hi}]")
        return self._rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        if not options:
            raise ValueError("nothing to pick from")
        return options[self._rng.randrange(len(options))]

    def flag(self) -> bool:
        return self._rng.random() < 0.5

    def real(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self._rng.random()


def composite(build: Callable[..., T]) -> Callable[..., st.SearchStrategy[T]]:
    """The Hypothesis strategy of a case builder ``build(choices, *args)``: each call of the
    result with ``*args`` is a strategy whose every choice is a draw."""

    @st.composite
    def strategy(draw: st.DrawFn, /, *args: object, **kwargs: object) -> T:
        return build(DrawnChoices(draw), *args, **kwargs)

    strategy.__doc__ = build.__doc__
    return strategy


def sample_distinct(
    build: Callable[[Choices], T], key: Callable[[T], str], *, seed: int, count: int
) -> list[T]:
    """Up to ``count`` distinct (by ``key``) results of ``build`` with :class:`SeededChoices`
    from ``seed``, in order; it stops after ``4 * count`` tries (a template with few runtime
    choices has few distinct variations)."""
    choices = SeededChoices(seed)
    out: list[T] = []
    seen: set[str] = set()
    for _ in range(4 * count):
        if len(out) == count:
            break
        item = build(choices)
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out
