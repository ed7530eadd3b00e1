"""The options every kernel-running command shares, and the session settings they make."""

from __future__ import annotations

import argparse
import math

from difftest.execution.health import HealthCheck
from difftest.execution.session import QUARANTINE_AFTER, SHRINK_SHARE, Settings
from difftest.model.errors import DifftestError


def add_session_arguments(p: argparse.ArgumentParser, *, budget: float | None = None) -> None:
    """``--isolation``, ``--deadline-s`` and (when ``budget`` is given, its default)
    ``--budget-s``, ``--shrink-share``, ``--quarantine-after``, ``--suppress-health-check``."""
    p.add_argument(
        "--isolation",
        choices=["process", "none"],
        default="process",
        help="process (default): paths run in a watched worker, so a crash or a hang is a "
        "verdict, never the end of the command; none: in this process (faster; a crash ends it)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds a path may take on a case before it is a HANG, plus a term for the "
        "case's work and a first compile (default 20 on a CPU, 30 on a GPU)",
    )
    if budget is None:
        return
    p.add_argument(
        "--budget-s",
        type=float,
        default=budget,
        help=f"wall-clock budget of the whole command, shrinking included (default {budget:g})",
    )
    p.add_argument(
        "--shrink-share",
        type=float,
        default=SHRINK_SHARE,
        help="share of the budget kept for shrinking while findings wait to be shrunk "
        f"(default {SHRINK_SHARE:g})",
    )
    p.add_argument(
        "--quarantine-after",
        type=int,
        default=QUARANTINE_AFTER,
        help="crashes or hangs of one path after which it is taken out of the run "
        f"(default {QUARANTINE_AFTER})",
    )
    p.add_argument(
        "--suppress-health-check",
        action="append",
        default=[],
        choices=[h.value for h in HealthCheck],
        metavar="NAME",
        help="silence a health check (repeatable): " + ", ".join(h.value for h in HealthCheck),
    )


def session_settings(
    args: argparse.Namespace, *, paths: tuple[str, ...] | None = None, **more: object
) -> Settings:
    """The :class:`Settings` of the shared options (checked), plus ``more``."""
    if args.deadline_s is not None and not (args.deadline_s > 0 and math.isfinite(args.deadline_s)):
        raise DifftestError(f"--deadline-s {args.deadline_s} must be a number > 0")
    if args.deadline_s is not None and args.isolation == "none":
        raise DifftestError("--deadline-s needs --isolation process (nothing watches in-process)")
    budget = getattr(args, "budget_s", None)
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise DifftestError(f"--budget-s {budget} must be a number > 0")
    fields: dict[str, object] = {
        "device": args.device,
        "paths": paths,
        "plugins": tuple(args.plugin),
        "isolation": args.isolation,
        "deadline_s": args.deadline_s,
    }
    if budget is not None:
        fields["budget_s"] = budget
        fields["shrink_share"] = args.shrink_share
        fields["quarantine_after"] = args.quarantine_after
    fields.update(more)
    return Settings(**fields)  # type: ignore[arg-type]


def path_names(text: str | None) -> tuple[str, ...] | None:
    """``--paths a,b`` as names (``None`` when not given)."""
    if not text:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    return names or None
