"""The pytest plugin: difftest's options, markers and fixtures, and the campaign as shard items.

Registered as the ``pytest11`` entry point ``difftest``, so it loads for every pytest run in an
environment where difftest is installed, including projects that never use it. It therefore
imports only pytest and difftest's pure modules at load time; torch, the kernel paths and the
campaign are imported by hooks and fixtures once a collected test uses a difftest fixture.

What it adds (a thin layer over the Python API, the same calls ``ci/gate`` makes):

- options in one ``--difftest-*`` group with ini and ``DIFFTEST_*`` mirrors
  (:mod:`difftest.interfaces.pytest_plugin.options` resolves them);
- fixtures: ``difftest_settings``, ``difftest_device``, ``difftest_registry`` (the resolved
  paths), ``difftest_batch`` (a batch factory), ``difftest_check`` (a one-call check that fails
  the test with the findings and their repro files) and ``difftest_shard``;
- every test that takes ``difftest_shard`` is parametrised into shard items ``shard-000`` ...
  (``--difftest-shards``); each runs its deterministic share of the campaign, so
  ``pytest -n auto`` spreads the campaign over workers, and under xdist each worker is pinned
  to its own GPU (:mod:`difftest.machine.gpu_pinning`);
- markers ``difftest`` (added to every test using a difftest fixture, so ``-m difftest``
  selects them) and ``difftest_paths(*names)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from difftest.campaign.sharding import Shard, all_shards
from difftest.interfaces.pytest_plugin.options import (
    OPTIONS,
    SettingError,
    Settings,
    resolve_settings,
)
from difftest.model.errors import DifftestError as DifftestErrorBase

if TYPE_CHECKING:
    import torch

    from difftest.campaign.suite import ShardPlan, ShardResult
    from difftest.execution.session import Session
    from difftest.interfaces.usercheck import PathSpec
    from difftest.machine.gpu_pinning import Pinning
    from difftest.model.batch import Batch
    from difftest.model.case import Case
    from difftest.model.outcome import CaseResult
    from difftest.paths.registry import KernelPath
    from difftest.triage.groups import KnownBug

FIXTURES = frozenset(
    {
        "difftest_settings",
        "difftest_device",
        "difftest_registry",
        "difftest_batch",
        "difftest_check",
        "difftest_shard",
    }
)
PROPERTY = "difftest"
"""``user_properties`` key carrying a shard item's result (JSON) to the controller."""
WORKER_SEED = "difftest_seed"
"""``workerinput`` key: the seed the xdist controller resolved (a date seed must not differ)."""

_SETTINGS = pytest.StashKey[Settings]()
_STATE = pytest.StashKey["_State"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("difftest", "difftest: differential testing of attention kernels")
    for opt in OPTIONS:
        group.addoption(
            opt.flag,
            dest=opt.dest,
            default=None,
            metavar=opt.metavar,
            action="append" if opt.repeatable else "store",
            help=f"{opt.help} [env {opt.env}, ini {opt.ini}]",
        )
        parser.addini(opt.ini, help=opt.help, default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "difftest: a differential test run by difftest (added to every test that uses a "
        "difftest fixture)",
    )
    config.addinivalue_line(
        "markers",
        "difftest_paths(*names): the kernel paths this test's difftest fixtures use",
    )
    workerinput = getattr(config, "workerinput", None)
    try:
        settings = resolve_settings(
            lambda o: config.getoption(o.dest),
            lambda o: config.getini(o.ini),
            os.environ,
            base_dir=config.rootpath,
            worker_seed=workerinput.get(WORKER_SEED) if workerinput else None,
        )
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[_SETTINGS] = settings
    config.pluginmanager.register(_ShardReports(settings), "difftest-shard-reports")
    if workerinput is None and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_SeedToWorkers(settings.seed), "difftest-seed-to-workers")


class _SeedToWorkers:
    """xdist controller hook: every worker runs the controller's seed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKER_SEED] = self.seed


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash.get(_SETTINGS, None)
    return f"difftest: {settings.describe()}" if settings and settings.explicit else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "difftest_shard" in metafunc.fixturenames:
        shards = all_shards(metafunc.config.stash[_SETTINGS].shards)
        metafunc.parametrize("difftest_shard", shards, ids=[s.id for s in shards], indirect=True)


def uses_difftest(item: pytest.Item) -> bool:
    return not FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects, so ``-m difftest`` sees the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if uses_difftest(item):
            item.add_marker("difftest")


def pytest_collection_finish(session: pytest.Session) -> None:
    # Pin the GPU and take the default path list now, before any test runs: paths that a
    # test registers while it runs are that test's own, never the campaign's.
    if any(uses_difftest(item) for item in session.items):
        _activate(session.config)


@dataclass(slots=True)
class _State:
    """What the first use of difftest in this process set up."""

    settings: Settings
    error: str | None = None
    pinning: Pinning | None = None
    memory_share: float | None = None
    """This xdist worker's share of its GPU's memory when other workers share the GPU
    (``None``: the whole device)."""
    device: torch.device | None = None
    default_paths: tuple[str, ...] = ()
    presets: tuple[str | None, ...] = (None,)
    sessions: dict[tuple[str, ...], Session] = field(default_factory=dict)
    """One per path list, reused by every shard item of this process, closed at the end."""
    known: tuple[KnownBug, ...] = ()
    """The default corpus's known bugs (their groups are labelled KNOWN)."""


def _activate(config: pytest.Config) -> _State:
    if _STATE in config.stash:
        return config.stash[_STATE]
    settings = config.stash[_SETTINGS]
    state = config.stash[_STATE] = _State(settings=settings)
    from difftest.machine.gpu_pinning import pin_worker
    from difftest.model.errors import DifftestError

    try:
        workerinput = getattr(config, "workerinput", None)
        if settings.pin_gpu == "auto" and settings.device is None:
            state.pinning = pin_worker(workerinput["workerid"] if workerinput else None)
        from difftest.campaign.profiles import expand_presets
        from difftest.generation.presets import PRESETS
        from difftest.machine.device import pick_device
        from difftest.paths import load_plugin, resolve

        for plugin in settings.plugins:
            load_plugin(plugin)
        pinned = state.pinning.device if state.pinning else ""
        state.device = pick_device(settings.device or pinned or None)
        if state.pinning is not None and workerinput is not None:
            state.memory_share = shared_gpu_memory(
                state.pinning, int(workerinput.get("workercount", 1)), state.device
            )
        state.presets = expand_presets(settings.presets, tuple(PRESETS))
        chosen = resolve(list(settings.paths) if settings.paths else None)
        state.default_paths = tuple(p.name for p in chosen)
        from difftest.records.corpus import known_bugs

        state.known = tuple(known_bugs())
    except DifftestError as e:
        state.error = f"difftest: {e}"
    return state


def _ready(config: pytest.Config) -> _State:
    state = _activate(config)
    if state.error is not None:
        pytest.fail(state.error, pytrace=False)
    return state


def _session(state: _State, names: tuple[str, ...]) -> Session:
    """The run session of a path list (one per list, reused by every shard item of this
    process, closed at the end). pytest keeps its own Ctrl-C: the session's interrupts are
    not installed as signal handlers here."""
    if names not in state.sessions:
        from difftest.execution.interrupts import Interrupts
        from difftest.execution.session import Session, Settings

        assert state.device is not None
        settings = Settings(
            device=str(state.device),
            paths=names,
            plugins=state.settings.plugins,
            isolation="process" if state.settings.isolation == "process" else "none",
            memory_share=state.memory_share,
        )
        state.sessions[names] = Session(settings, interrupts=Interrupts())
    return state.sessions[names]


def _path_names(node: pytest.Item, state: _State) -> tuple[str, ...]:
    """``@pytest.mark.difftest_paths(...)``, else ``--difftest-paths``, else every path
    registered when collection finished."""
    marker = node.get_closest_marker("difftest_paths")
    return tuple(marker.args) if marker and marker.args else state.default_paths


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        for run_session in state.sessions.values():
            run_session.close()
        state.sessions.clear()


@pytest.fixture(scope="session")
def difftest_settings(pytestconfig: pytest.Config) -> Settings:
    """The resolved difftest settings of this run."""
    return pytestconfig.stash[_SETTINGS]


@pytest.fixture(scope="session")
def difftest_device(pytestconfig: pytest.Config) -> torch.device:
    """The device difftest runs on here (this xdist worker's own GPU when pinned)."""
    device = _ready(pytestconfig).device
    assert device is not None
    return device


@pytest.fixture
def difftest_registry(request: pytest.FixtureRequest) -> list[KernelPath]:
    """The kernel paths this test uses: ``@pytest.mark.difftest_paths(...)``, else
    ``--difftest-paths``, else every path registered when collection finished."""
    from difftest.paths import resolve

    state = _ready(request.config)
    try:
        return resolve(list(_path_names(request.node, state)))
    except LookupError as e:
        pytest.fail(f"difftest: {e}", pytrace=False)


@pytest.fixture
def difftest_batch(difftest_device: torch.device) -> Callable[..., Batch]:
    """``difftest_batch(case=None, *, preset=None, mode=None, seed=0) -> Batch``: ``case``
    materialised on the difftest device, or (without one) a case drawn deterministically."""
    from difftest.generation.materialize import materialize
    from difftest.generation.sampling import sample_cases
    from difftest.generation.strategies import CPU_LIMITS, GPU_LIMITS, cases

    def make(
        case: Case | None = None,
        *,
        preset: str | None = None,
        mode: str | None = None,
        seed: int = 0,
    ) -> Batch:
        if case is None:
            limits = GPU_LIMITS if difftest_device.type == "cuda" else CPU_LIMITS
            strategy = cases(preset=preset, mode=mode, limits=limits)
            case = sample_cases(strategy, seed=seed, count=1)[0]
        return materialize(case, difftest_device)

    return make


@pytest.fixture
def difftest_check(
    difftest_registry: list[KernelPath], difftest_device: torch.device, difftest_settings: Settings
) -> Callable[..., CaseResult]:
    """``difftest_check(case_or_batch, paths_or_run_fn=None) -> CaseResult``: run the case
    through the paths (default: ``difftest_registry``) or a kernel function and the oracle;
    on a finding, write its repro and fail the test with one line per finding."""
    from difftest.interfaces.usercheck import CheckFailed, check

    def run(case_or_batch: Case | Batch, paths: PathSpec = None) -> CaseResult:
        try:
            return check(
                case_or_batch,
                difftest_registry if paths is None else paths,
                device=difftest_device,
                repro_dir=difftest_settings.repro_dir / "findings",
                plugins=difftest_settings.plugins,
            )
        except CheckFailed as e:
            pytest.fail(str(e), pytrace=False)

    return run


@pytest.fixture
def difftest_shard(request: pytest.FixtureRequest) -> ShardItem:
    """One shard of the campaign (tests taking this fixture become shard items)."""
    shard = getattr(request, "param", None)
    if not isinstance(shard, Shard):
        pytest.fail("difftest_shard is parametrised by the difftest plugin only", pytrace=False)
    return ShardItem(shard=shard, state=_ready(request.config), node=request.node)


def shared_gpu_memory(pinning: Pinning, worker_count: int, device: torch.device) -> float | None:
    """The share of its GPU's memory an xdist worker's cases may hold: with ``pytest -n 16`` on
    one GPU sixteen workers run cases on it at once, and without a bound each one's allocator
    keeps the peak of its largest case (an H200 ran out with eight campaign workers on it,
    2026-12-05). Out of :data:`~difftest.execution.isolation.early.POOL_MEMORY`, as a launch
    pool's workers share it; ``None`` when the worker has its GPU to itself, or none."""
    from difftest.execution.isolation.early import POOL_MEMORY

    sharing = pinning.workers_sharing(worker_count)
    if device.type != "cuda" or sharing < 2:
        return None
    return POOL_MEMORY / sharing


def _pin_text(pinning: Pinning | None, memory_share: float | None = None) -> str:
    if pinning is None or pinning.worker in (None, "", "master"):
        return ""
    shared = f"; {memory_share:.1%} of its memory" if memory_share is not None else ""
    return f"{pinning.worker}: {pinning.reason}{shared}"


@dataclass(slots=True)
class ShardItem:
    """A shard item's work: ``difftest_shard.check()`` runs it and fails on findings."""

    shard: Shard
    state: _State
    node: pytest.Item

    def plan(self) -> ShardPlan:
        from difftest.campaign.suite import ShardPlan

        s = self.state.settings
        assert self.state.device is not None
        return ShardPlan(
            seed=s.seed,
            out_dir=s.repro_dir,
            shard=self.shard,
            presets=self.state.presets,
            mode=s.mode,
            max_cases=s.max_cases,
            budget_s=s.budget_s,
            cases_per_variant=s.profile.cases_per_variant(self.state.device.type),
            determinism_every=s.profile.determinism_every,
            known=self.state.known,
        )

    def run(self) -> ShardResult:
        """Run this shard's sub-campaigns and attach the result to the test report."""
        from difftest.campaign.suite import run_shard
        from difftest.machine.gpu_pinning import device_identity

        try:
            session = _session(self.state, _path_names(self.node, self.state))
        except (LookupError, DifftestErrorBase) as e:
            pytest.fail(f"difftest: {e}", pytrace=False)
        error: str | None = None
        try:
            result = run_shard(self.plan(), session)
        except DifftestErrorBase as e:  # one the run met: a case too large for its memory
            error = f"difftest: {e}"
        if error is not None:  # failed outside the except clause: one line, no chained error
            pytest.fail(error, pytrace=False)
        record = {
            **result.to_json(),
            "item": self.node.name,
            "profile": self.state.settings.profile.name,
            "device": device_identity(str(self.state.device)),
            "worker": self.state.pinning.worker if self.state.pinning else None,
            "pinning": _pin_text(self.state.pinning, self.state.memory_share),
        }
        self.node.user_properties.append((PROPERTY, json.dumps(record)))
        return result

    def check(self) -> ShardResult:
        result = self.run()
        lines = result.failure_lines() + result.health_errors()
        if lines:
            count = len(result.unexpected())
            packed = len(result.packed_only())
            also = f" and {packed} packed-only group(s)" if packed else ""
            head = (
                f"difftest shard {self.shard}: {count} unexpected group(s){also} in "
                f"{len(result.cases)} cases"
            )
            pytest.fail("\n".join([head, *lines]), pytrace=False)
        return result


class _ShardReports:
    """Collects shard items' results where every report arrives (the xdist controller, or
    the only process) and prints them once at the end."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, str):
                self.results.append(json.loads(value))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.results:
            return
        results = sorted(self.results, key=lambda r: (r["item"], r["shard"]))
        tr = terminalreporter
        # The same bug found by several shards is one group: merged by id and preset.
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for r in results:
            for g in r["groups"]:
                key = (g["id"], g["preset"])
                if key in merged:
                    merged[key]["count"] += g["count"]
                else:
                    merged[key] = dict(g)
        groups = list(merged.values())
        findings = sum(int(r["findings"]) for r in results)
        cases = sum(int(r["cases"]) for r in results)
        tr.write_sep("=", "difftest")
        tr.write_line(
            f"difftest: {len(results)} shard(s) ran {cases} cases (profile "
            f"{self.settings.profile.name}, seed {self.settings.seed}): {findings} finding(s) "
            f"in {len(groups)} group(s), {sum(1 for g in groups if g['known'] is None)} new"
        )
        for r in results:
            pin = f", {r['pinning']}" if r["pinning"] else ""
            tr.write_line(
                f"  {r['item']} {r['shard']}: {r['cases']} cases, case digest "
                f"{r['case_digest']}, on {r['device']}{pin}"
            )
        # NEW groups first, then KNOWN (each labelled with its corpus entry)
        for g in sorted(groups, key=lambda g: (g["known"] is not None, -g["count"])):
            label = "NEW" if g["known"] is None else f"KNOWN {g['known']}"
            tr.write_line(
                f"  {label}: {g['path']} {g['kind']} [preset {g['preset']}]: {g['count']} "
                f"finding(s); needs {g['trigger_words']}"
            )
            tr.write_line(f"      minimal: {g['minimal_case']}")
            tr.write_line(f"      repro: {g['minimal']}")
