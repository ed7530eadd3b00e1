"""The pytest plugin, through real pytest runs in a subprocess (``pytester``), plus its
settings precedence in-process."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import hypothesis
import pytest
import torch

from difftest.interfaces.pytest_plugin.options import (
    BUDGET,
    MAX_CASES,
    OPTIONS,
    PLUGINS,
    SEED,
    Option,
    SettingError,
    resolve_settings,
)
from difftest.interfaces.usercheck import CheckFailed, check
from difftest.model.batch import Batch
from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.paths import KernelPath, get_path
from difftest.records.repro import load_repro

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def _plugin_args() -> list[str]:
    """Load the plugin by name unless it is installed as an entry point (loading it twice
    would register the same module under two names)."""
    installed = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value == "difftest.interfaces.pytest_plugin.hooks" for ep in installed):
        return []
    return ["-p", "difftest.interfaces.pytest_plugin.hooks"]


@pytest.fixture
def tester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), path) if p))
    for opt in OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    return pytester


def _run(tester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return tester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", *args)


BAD_KERNEL = """
import difftest
from difftest.paths import get_path

def _run(batch):
    return get_path("torch-sdpa").run(batch) + 1.0

difftest.register_path("off-by-one", _run)
"""

SHARD_TESTS = """
import pytest

@pytest.mark.difftest_paths("torch-sdpa")
def test_good(difftest_shard):
    difftest_shard.check()

@pytest.mark.difftest_paths("torch-sdpa", "off-by-one")
def test_bad(difftest_shard):
    difftest_shard.check()
"""


@pytest.mark.slow  # three processes each import torch
def test_shard_items_spread_over_xdist_workers(tester: pytest.Pytester) -> None:
    tester.makepyfile(test_shards=SHARD_TESTS, bad_kernel=BAD_KERNEL)
    result = _run(
        tester, "-n", "2", "-v", "--difftest-shards", "2", "--difftest-max-cases", "4",
        "--difftest-plugins", "bad_kernel.py", "--difftest-isolation", "none",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "*PASSED test_shards.py::test_good[[]shard-000[]]*",
            "*PASSED test_shards.py::test_good[[]shard-001[]]*",
            "*FAILED test_shards.py::test_bad[[]shard-000[]]*",
            "*FAILED test_shards.py::test_bad[[]shard-001[]]*",
            # The failure: the group, what it needs, its minimal case and repro.
            "difftest shard 0/2: 1 unexpected group(s) in 2 cases",
            "NEW: off-by-one WRONG (tolerance) [[]preset any[]]: 2 finding(s), *",
            "    needs: any case (no feature needed)",
            "    repro: */difftest-out/shard-000/any/groups/off-by-one-wrong-*.repro.json",
            # The summary, from the controller: every shard item, the worker that ran it,
            # then the groups.
            "difftest: 4 shard(s) ran 8 cases (profile dev, seed 0): 4 finding(s) in 1 "
            "group(s), 1 new",
            "  NEW: off-by-one WRONG [[]preset any[]]: 4 finding(s); needs any case (no "
            "feature needed)",
            "  test_good[[]shard-000[]] 0/2: 2 cases, case digest *, on cpu, gw?: no GPU",
            "  test_bad[[]shard-001[]] 1/2: 2 cases, case digest *, on cpu, gw?: no GPU",
        ]
    )
    workers = {m.group(1) for line in result.outlines if (m := re.search(r", (gw\d+): ", line))}
    assert workers == {"gw0", "gw1"}
    groups = list((tester.path / "difftest-out").glob("shard-*/any/groups/off-by-one-*.json"))
    assert len(groups) == 2  # one group per shard, each with its minimal repro
    logs = list((tester.path / "difftest-out").glob("shard-*/any/findings.jsonl"))
    assert sum(len(f.read_text().splitlines()) for f in logs) == 4  # every finding kept


ONE_SHARD = """
import pytest

@pytest.mark.difftest_paths("torch-sdpa")
def test_good(difftest_shard):
    difftest_shard.check()
"""

OOM_PLUGIN = """
from difftest.execution import bounds


def _no_memory(*args, **kwargs):
    raise RuntimeError("Triton Error [CUDA]: out of memory")


bounds.oracle_and_bounds = _no_memory  # every launch, in the isolated worker too
"""


@pytest.mark.slow  # two processes each import torch
def test_a_case_too_large_for_the_workers_memory_fails_its_item_in_one_line(
    tester: pytest.Pytester,
) -> None:
    """A case that runs its isolated worker out of memory twice (as cases on a GPU that
    sixteen xdist workers share might) fails its shard item with difftest's one-line error,
    not a traceback."""
    tester.makepyfile(test_shard=ONE_SHARD, oom=OOM_PLUGIN)
    args = ["--difftest-shards", "1", "--difftest-max-cases", "2", "--difftest-plugins", "oom.py"]
    result = _run(tester, *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*difftest: case * does not fit in the memory left to a worker on cpu (out of memory "
            "twice*Triton Error [[]CUDA[]]: out of memory*fewer workers on the device "
            "(--workers, pytest -n) or smaller --limits"
        ]
    )
    output = result.stdout.str()
    assert "Traceback" not in output and "During handling" not in output


FIXTURE_TESTS = """
import pytest
import torch
from hypothesis import Phase, given, settings
from difftest.generation.strategies import cases
import difftest
from difftest.interfaces.usercheck import check

def good(batch):
    return difftest.get_path("torch-sdpa").run(batch)

def bad_kernel(batch):
    return good(batch) * 2

@pytest.mark.difftest_paths("torch-sdpa")
def test_registry_marker(difftest_registry):
    assert [p.name for p in difftest_registry] == ["torch-sdpa"]

def test_batch_factory(difftest_batch, difftest_device):
    batch = difftest_batch(seed=3)
    assert batch.device == difftest_device == torch.device("cpu")
    assert difftest_batch(batch.case).case == batch.case

def test_check_agrees(difftest_batch, difftest_check):
    result = difftest_check(difftest_batch(seed=1), good)
    assert [r.outcome.value for r in result.results] == ["AGREE"]

def test_check_finding(difftest_batch, difftest_check):
    difftest_check(difftest_batch(seed=1), bad_kernel)

@settings(max_examples=3, database=None, derandomize=True, deadline=None)
@given(cases(mode="target_verify"))
def test_given_good(case):
    check(case, good)

# No shrink phase: keeps this test quick; the failure is still reported with its example.
@settings(max_examples=3, database=None, derandomize=True, deadline=None,
          phases=[Phase.explicit, Phase.generate])
@given(cases(mode="target_verify"))
def test_given_bad(case):
    check(case, bad_kernel)

def test_plain():
    pass
"""


def test_fixtures_and_the_user_check(tester: pytest.Pytester) -> None:
    tester.makepyfile(test_fixtures=FIXTURE_TESTS)
    result = _run(tester, "-v")
    result.assert_outcomes(passed=5, failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "*test_check_finding FAILED*",
            "*test_given_bad FAILED*",
            "difftest: 1 finding(s) on case *",
            "user-bad_kernel WRONG: * over tolerance*",
            "    repro: */difftest-out/findings/*-user-bad_kernel-wrong.json",
            "E       difftest.interfaces.usercheck.CheckFailed: difftest: 1 finding(s) on case *",
            # Hypothesis reports the shrunk example as "Falsifying example:" (up to 6.16x) or
            # "Failing test case:" (later releases).
            "E*: test_given_bad(",
        ]
    )
    deselected = _run(tester, "--collect-only", "-q", "-m", "not difftest")
    deselected.stdout.fnmatch_lines(["*test_given_good", "*test_plain", "*4 deselected*"])


def test_an_invalid_environment_value_is_a_usage_error(
    tester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIFFTEST_SEED", "soon")
    tester.makepyfile(test_plain="def test_plain(): pass")
    result = _run(tester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: difftest: DIFFTEST_SEED (environment) = 'soon': expected an integer >= 0"]
    )


def test_plugin_module_imports_nothing_heavy() -> None:
    # With the package's __init__ bypassed, importing the plugin must not pull in torch, the
    # kernel paths, the generators or any other difftest module that would.
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('difftest'); pkg.__path__ = [{str(ROOT / 'difftest')!r}]\n"
        "sys.modules['difftest'] = pkg\n"
        "import difftest.interfaces.pytest_plugin.hooks\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'flashinfer', 'hypothesis', 'generators', 'numpy'))\n"
        "ours = sorted(m for m in sys.modules if m.startswith('difftest.'))\n"
        "print(heavy, ours)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = [
        "difftest.model.errors",
        "difftest.interfaces.pytest_plugin.hooks",
        "difftest.interfaces.pytest_plugin.options",
    ]
    expected += ["difftest.campaign.profiles", "difftest.campaign.sharding"]
    # the (docstring-only) packages those modules live in
    expected += ["difftest.campaign", "difftest.interfaces", "difftest.model"]
    expected += ["difftest.interfaces.pytest_plugin"]
    assert done.stdout.strip() == f"[] {sorted(expected)}"


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, difftest.interfaces.pytest_plugin.hooks; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "False"


# -- precedence, in-process ------------------------------------------------------------------


def test_command_line_then_environment_then_ini_then_profile() -> None:
    cli: dict[Option, str] = {SEED: "9"}
    env = {SEED.env: "7"}
    ini = {SEED: "5"}
    base = Path("/project")
    s = resolve_settings(cli.get, lambda o: ini.get(o, ""), env, base_dir=base)
    assert (s.seed, s.sources["seed"]) == (9, "--difftest-seed (command line)")
    s = resolve_settings(lambda o: None, lambda o: ini.get(o, ""), env, base_dir=base)
    assert (s.seed, s.sources["seed"]) == (7, "DIFFTEST_SEED (environment)")
    s = resolve_settings(lambda o: None, lambda o: ini.get(o, ""), {}, base_dir=base)
    assert (s.seed, s.sources["seed"]) == (5, "difftest_seed (ini file)")
    s = resolve_settings(lambda o: None, lambda o: "", {}, base_dir=base)
    assert (s.seed, s.sources["seed"], s.explicit) == (0, "default", False)
    assert (s.profile.name, s.max_cases, s.shards) == ("dev", 64, 4)
    assert s.repro_dir == Path("/project/difftest-out")


def test_the_profile_sets_defaults_and_options_override_them() -> None:
    s = resolve_settings(
        lambda o: {"profile": "ci", "shards": "3"}.get(o.name),
        lambda o: "",
        {PLUGINS.env: "a.py, b"},
        base_dir=Path("/p"),
    )
    assert (s.profile.name, s.budget_s, s.max_cases, s.shards) == ("ci", None, 128, 3)
    assert s.plugins == ("a.py", "b")
    assert s.presets == ("any", "all")


def test_an_xdist_worker_runs_the_controllers_seed() -> None:
    s = resolve_settings(
        lambda o: {"profile": "nightly"}.get(o.name), lambda o: "", {}, base_dir=Path("/p"),
        worker_seed=20250601,
    )  # fmt: skip
    assert (s.seed, s.sources["seed"]) == (20250601, "xdist controller")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (SEED, "-3", "difftest: --difftest-seed (command line) = '-3': expected an integer >= 0"),
        (MAX_CASES, "many", "= 'many': expected an integer >= 1"),
        (BUDGET, "0", "= '0': expected a number of seconds > 0, or 'none'"),
        (Option("profile", ""), "weekly", "= 'weekly': unknown profile; profiles: dev, ci"),
        (Option("mode", ""), "decode", "expected one of target_verify, draft_extend_v2 or 'any'"),
        (Option("shards", ""), "0", "--difftest-shards (command line) = '0': expected an int"),
    ],
)
def test_invalid_values_name_their_source(option: Option, value: str, message: str) -> None:
    with pytest.raises(SettingError) as info:
        resolve_settings(
            lambda o: value if o.name == option.name else None,
            lambda o: "",
            {},
            base_dir=Path("/p"),
        )
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_budget_and_case_count_cannot_both_be_none() -> None:
    with pytest.raises(SettingError, match="nothing would stop the run"):
        resolve_settings(
            lambda o: "none" if o in (BUDGET, MAX_CASES) else None,
            lambda o: "",
            {},
            base_dir=Path("/p"),
        )


# -- the user check, in-process ---------------------------------------------------------------


def _small_case() -> Case:
    return Case(
        attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
        batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=3),
        seed=11,
    )


def _sdpa(batch: Batch) -> torch.Tensor:
    return get_path("torch-sdpa").run(batch)


def test_check_writes_a_loadable_repro_per_finding(tmp_path: Path) -> None:
    def doubled(batch: Batch) -> torch.Tensor:
        return _sdpa(batch) * 2

    with pytest.raises(CheckFailed) as info:
        check(_small_case(), [get_path("torch-sdpa"), doubled], device="cpu", repro_dir=tmp_path)
    lines = str(info.value).splitlines()
    assert lines[0] == f"difftest: 1 finding(s) on case {_small_case().digest()}"
    assert lines[1].startswith("user-doubled WRONG: ")
    (file,) = tmp_path.glob("*.json")
    assert lines[2] == f"    repro: {file}"
    assert file.name == f"{_small_case().digest()}-user-doubled-wrong.json"
    repro = load_repro(file)
    assert repro.case == _small_case() and repro.paths == ("torch-sdpa", "user-doubled")
    assert info.value.result.result_for("torch-sdpa") is not None


def test_check_refuses_a_case_no_path_ran() -> None:
    picky = KernelPath(name="picky", run=_sdpa, supports=lambda case, device: "too picky")
    with pytest.raises(CheckFailed, match=r"no path ran case \w+ \(picky: too picky\)"):
        check(_small_case(), picky, device="cpu")
    result = check(_small_case(), picky, device="cpu", allow_unsupported=True)
    assert [r.outcome.value for r in result.results] == ["UNSUPPORTED"]


def test_check_rejects_unsupported_cases_inside_hypothesis() -> None:
    picky = KernelPath(name="picky", run=_sdpa, supports=lambda case, device: "too picky")

    @hypothesis.settings(max_examples=5, database=None, derandomize=True, deadline=None)
    @hypothesis.given(hypothesis.strategies.just(_small_case()))
    def test(case: Case) -> None:
        check(case, picky, device="cpu")

    with pytest.raises(hypothesis.errors.Unsatisfiable):
        test()
