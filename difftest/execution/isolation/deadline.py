"""How long a path may take on a case before the watchdog calls it a hang.

A deadline is a base (launch, synchronise, judge) plus a term proportional to the case's work
(:meth:`Case.work`, multiply-adds) and size (:meth:`Case.size`, elements to generate and
compare). The first time a worker runs a path on a kernel *variant* (dtypes, head geometry,
page size, mask features: what a JIT library compiles a module for) a generous cold-start
allowance is added, because a first call can compile for minutes. The rates are per device
type: a GPU does in a millisecond what the CPU fallbacks do in a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from difftest.model.case import Case

Variant = tuple[object, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deadline:
    """Per-phase time limits for one case in an isolated worker (seconds)."""

    base_s: float = 20.0
    """Allowed for any path on any case: launch, synchronise, judge the output."""
    per_gwork_s: float = 200.0
    """Per 10**9 multiply-adds of :meth:`Case.work` (doubled when the determinism rerun runs)."""
    per_melem_s: float = 20.0
    """Per 10**6 elements of :meth:`Case.size` (generating, comparing)."""
    cold_s: float = 5.0
    """Added the first time a worker runs a path on a variant (JIT compile, module load)."""
    setup_s: float = 60.0
    """Base for the phase before the first path: materialise the batch and run the oracle."""
    setup_factor: float = 8.0
    """The oracle phase gets this many times the work and size terms (float64, several
    noise floors)."""
    startup_s: float = 120.0
    """For a fresh worker to import torch and the plugins and report ready."""
    grace_s: float = 1.0
    """Between SIGTERM and SIGKILL when a hung worker is stopped."""

    def __post_init__(self) -> None:
        for name in (
            "base_s",
            "per_gwork_s",
            "per_melem_s",
            "cold_s",
            "setup_s",
            "setup_factor",
            "startup_s",
            "grace_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Deadline.{name}={value!r} must be a number >= 0")
        if self.base_s <= 0 or self.startup_s <= 0:
            raise ValueError("Deadline.base_s and Deadline.startup_s must be > 0")

    @classmethod
    def for_device(cls, device_type: str) -> Deadline:
        """Defaults for a device type: tight rates and a long cold start (JIT) on a GPU."""
        if device_type == "cuda":
            return cls(base_s=30.0, per_gwork_s=2.0, per_melem_s=1.0, cold_s=600.0)
        return cls()

    def _scaled(self, case: Case, reruns: int) -> float:
        return reruns * case.work() / 1e9 * self.per_gwork_s + case.size() / 1e6 * self.per_melem_s

    def for_path(self, case: Case, *, cold: bool, check_determinism: bool = False) -> float:
        """Seconds from a path's start (as the worker reports it) to the next message."""
        reruns = 2 if check_determinism else 1
        return self.base_s + self._scaled(case, reruns) + (self.cold_s if cold else 0.0)

    def for_setup(self, case: Case) -> float:
        """Seconds from sending a case to the worker until it starts the first path."""
        return self.setup_s + self.setup_factor * self._scaled(case, 1)
