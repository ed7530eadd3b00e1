"""Mutant kernels: correct paths with one injected bug each, for measuring difftest itself.

Every mutant is ``torch-paged-online`` (:mod:`difftest.calibration.mutants.kernel`) with one bug
from the bug classes of ``docs/semantics.md``, grouped by family:
:mod:`~difftest.calibration.mutants.metadata`,
:mod:`~difftest.calibration.mutants.masking`, :mod:`~difftest.calibration.mutants.heads`,
:mod:`~difftest.calibration.mutants.paging`, :mod:`~difftest.calibration.mutants.scaling`,
:mod:`~difftest.calibration.mutants.numerics` and :mod:`~difftest.calibration.mutants.process`;
:mod:`~difftest.calibration.mutants.pairs` puts two of them in one kernel. Importing this
package registers them all as paths tagged ``mutant``, which :func:`difftest.paths.resolve`
leaves out of ordinary campaigns; ``difftest selftest`` runs them
(``--plugin difftest.calibration.mutants`` makes them available to any other command by name).
"""

from __future__ import annotations

from difftest.calibration.mutants import (
    heads,
    masking,
    metadata,
    numerics,
    paging,
    process,
    scaling,
)
from difftest.calibration.mutants.mutant import MUTANT_TAG, Mutant
from difftest.calibration.mutants.pairs import PAIRS, Pair
from difftest.model.errors import DifftestError
from difftest.paths.registry import register

__all__ = ["MUTANTS", "MUTANT_TAG", "PAIRS", "Mutant", "Pair", "get_mutant", "get_pair"]

MUTANTS: tuple[Mutant, ...] = (
    *metadata.MUTANTS,
    *masking.MUTANTS,
    *heads.MUTANTS,
    *paging.MUTANTS,
    *scaling.MUTANTS,
    *numerics.MUTANTS,
    *process.MUTANTS,
)
"""Every mutant, in report order."""


def get_mutant(name: str) -> Mutant:
    for mutant in MUTANTS:
        if mutant.name == name:
            return mutant
    known = ", ".join(m.name for m in MUTANTS)
    raise DifftestError(f"unknown mutant {name!r}; mutants: {known}")


def get_pair(name: str) -> Pair:
    for pair in PAIRS:
        if pair.name == name:
            return pair
    known = ", ".join(p.name for p in PAIRS)
    raise DifftestError(f"unknown mutant pair {name!r}; pairs: {known}")


for _mutant in MUTANTS:
    register(_mutant.path(), replace=True)
for _pair in PAIRS:
    register(_pair.path(), replace=True)
