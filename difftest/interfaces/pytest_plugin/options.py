"""The pytest plugin's settings: option names, and where each value comes from.

Every setting has one command-line flag in the ``--difftest-*`` group, an ini key and an
environment variable, all derived from one :class:`Option` constant. :func:`resolve_settings`
is the only place precedence lives: the command line, then ``DIFFTEST_*`` in the environment,
then the ini file, then the profile (``dev`` unless chosen). An invalid value is a one-line
error naming its source (``DIFFTEST_SEED (environment) = 'x': expected an integer >= 0``).

Standard library and difftest's pure modules only: this is imported on every pytest run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difftest.campaign.profiles import DEFAULT_PROFILE, PROFILES, Profile

MODES = ("target_verify", "draft_extend_v2")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting's names: ``--difftest-<name>``, ini ``difftest_<name>``,
    ``DIFFTEST_<NAME>``."""

    name: str
    help: str
    metavar: str = "VALUE"
    repeatable: bool = False
    """On the command line, given once per value (``--difftest-plugin A --difftest-plugin B``);
    in the environment and the ini file, a comma-separated list."""

    @property
    def flag(self) -> str:
        return "--difftest-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "difftest_" + self.name

    @property
    def ini(self) -> str:
        return "difftest_" + self.name

    @property
    def env(self) -> str:
        return "DIFFTEST_" + self.name.upper()


PROFILE = Option("profile", f"run profile: {', '.join(PROFILES)} (default {DEFAULT_PROFILE})")
SEED = Option("seed", "campaign seed (default: the profile's)", "N")
BUDGET = Option("budget_s", "wall-clock bound per shard and preset, or 'none'", "SECONDS")
MAX_CASES = Option("max_cases", "cases per preset over all shards, or 'none'", "N")
PATHS = Option("paths", "comma-separated kernel paths (default: every registered one)", "NAMES")
PRESET = Option("preset", "comma-separated model presets, 'any' or 'all'", "NAMES")
MODE = Option("mode", f"batch mode: {', '.join(MODES)} or 'any'", "MODE")
REPRO_DIR = Option("repro_dir", "directory for repro files (default difftest-out)", "DIR")
PLUGINS = Option("plugins", "module or .py file that registers paths", "MODULE", repeatable=True)
SHARDS = Option("shards", "how many shard items the campaign is split into", "N")
DEVICE = Option("device", "torch device (default: the worker's GPU, else cpu)", "DEVICE")
PIN_GPU = Option("pin_gpu", "under xdist, worker gwK gets GPU K mod num_gpus: auto or off", "WHEN")
ISOLATION = Option("isolation", "where paths run: process (isolated) or none", "WHERE")

OPTIONS = (
    PROFILE,
    SEED,
    BUDGET,
    MAX_CASES,
    PATHS,
    PRESET,
    MODE,
    REPRO_DIR,
    PLUGINS,
    SHARDS,
    DEVICE,
    PIN_GPU,
    ISOLATION,
)

DEFAULT_SOURCE = "default"


class SettingError(ValueError):
    """A setting's value is invalid; the message is one line naming the source."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The resolved settings of one pytest run."""

    profile: Profile
    seed: int
    budget_s: float | None
    max_cases: int | None
    paths: tuple[str, ...] | None
    """``None``: the paths registered when collection finished."""
    presets: tuple[str, ...]
    """Names, ``any`` or ``all`` (expanded when difftest is first used)."""
    mode: str | None
    repro_dir: Path
    plugins: tuple[str, ...]
    shards: int
    device: str | None
    pin_gpu: str
    isolation: str
    sources: dict[str, str] = field(default_factory=dict)
    """Option name -> where its value came from (``default``: the profile or built in)."""

    @property
    def explicit(self) -> bool:
        return any(s != DEFAULT_SOURCE for s in self.sources.values())

    def describe(self) -> str:
        budget = "none" if self.budget_s is None else f"{self.budget_s:g}s"
        fixed = " (derandomised)" if self.budget_s is None else ""
        return (
            f"profile {self.profile.name}{fixed}, seed {self.seed}, "
            f"max_cases {self.max_cases or 'none'}, budget {budget}, {self.shards} shard(s), "
            f"presets {','.join(self.presets)}"
        )


Lookup = Callable[[Option], object]


def resolve_settings(
    cli: Lookup,
    ini: Lookup,
    environ: Mapping[str, str],
    *,
    base_dir: Path,
    worker_seed: int | None = None,
) -> Settings:
    """Resolve every setting: command line, then environment, then ini, then profile.

    ``cli(option)`` is the parsed command-line value (``None`` or ``[]`` when absent);
    ``ini(option)`` the ini string (``""`` when absent); relative directories are taken
    from ``base_dir``. ``worker_seed``: the seed a pytest-xdist controller resolved, which a
    worker uses so that every worker runs the same campaign.
    """
    sources: dict[str, str] = {}

    def raw(opt: Option) -> tuple[str | None, str]:
        value = cli(opt)
        if value not in (None, [], ""):
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            return text, f"{opt.flag} (command line)"
        env = environ.get(opt.env, "").strip()
        if env:
            return env, f"{opt.env} (environment)"
        from_ini = str(ini(opt) or "").strip()
        if from_ini:
            return from_ini, f"{opt.ini} (ini file)"
        return None, DEFAULT_SOURCE

    def get(opt: Option, parse: Callable[[str], Any], default: Any) -> Any:
        text, source = raw(opt)
        sources[opt.name] = source
        if text is None:
            return default
        try:
            return parse(text)
        except SettingError as e:
            raise SettingError(f"difftest: {source} = {text!r}: {e}") from None

    profile: Profile = get(PROFILE, _profile, PROFILES[DEFAULT_PROFILE])
    seed: int = get(SEED, _non_negative, None)
    if worker_seed is not None:
        seed, sources[SEED.name] = worker_seed, "xdist controller"
    elif seed is None:
        seed = profile.resolved_seed()
    budget = get(BUDGET, _budget, profile.budget_s)
    max_cases = get(MAX_CASES, _max_cases, profile.max_cases)
    if budget is None and max_cases is None:
        raise SettingError(
            f"difftest: {BUDGET.flag} and {MAX_CASES.flag} are both 'none' "
            f"({sources[BUDGET.name]}, {sources[MAX_CASES.name]}): nothing would stop the run"
        )
    repro_dir = get(REPRO_DIR, Path, Path("difftest-out"))
    return Settings(
        profile=profile,
        seed=seed,
        budget_s=budget,
        max_cases=max_cases,
        paths=get(PATHS, _names, None),
        presets=get(PRESET, _names, profile.presets),
        mode=get(MODE, _mode, None),
        repro_dir=repro_dir if repro_dir.is_absolute() else base_dir / repro_dir,
        plugins=get(PLUGINS, _names, ()),
        shards=get(SHARDS, _positive, profile.shards),
        device=get(DEVICE, str, None),
        pin_gpu=get(PIN_GPU, _choice("auto", "off"), "auto"),
        isolation=get(ISOLATION, _choice("process", "none"), "process"),
        sources=sources,
    )


def _profile(text: str) -> Profile:
    if text not in PROFILES:
        raise SettingError(f"unknown profile; profiles: {', '.join(PROFILES)}")
    return PROFILES[text]


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise SettingError(f"expected an integer >= {minimum}")
    return value


def _non_negative(text: str) -> int:
    return _int(text, 0)


def _positive(text: str) -> int:
    return _int(text, 1)


def _max_cases(text: str) -> int | None:
    return None if text.lower() == "none" else _int(text, 1)


def _budget(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise SettingError("expected a number of seconds > 0, or 'none'")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.replace("\n", ",").split(",") if n.strip())
    if not names:
        raise SettingError("expected a comma-separated list of names")
    return names


def _mode(text: str) -> str | None:
    if text == "any":
        return None
    if text not in MODES:
        raise SettingError(f"expected one of {', '.join(MODES)} or 'any'")
    return text


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise SettingError(f"expected one of {', '.join(choices)}")
        return text

    return parse
