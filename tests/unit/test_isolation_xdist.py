"""Under ``pytest -n 2``, a case that crashes or hangs fails its own test and nothing else:
the xdist worker survives, and every other test on it still runs and reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "fixtures" / "bad_paths.py"
VERDICT = re.compile(r"^\[(gw\d+)\] \[\s*\d+%\] (PASSED|FAILED) (\S+)")

CONFTEST = """
import pytest

from difftest.model.case import AttentionConfig, BatchSpec, Case
from difftest.execution.isolation import Deadline, IsolatedExecutor
from difftest.paths import load_plugin, resolve

PLUGIN = {plugin!r}
load_plugin(PLUGIN)


@pytest.fixture(scope="session")
def run_case():
    made = {{}}

    def run(path, seed):
        if path not in made:
            made[path] = IsolatedExecutor(
                resolve([path]), "cpu", plugins=[PLUGIN],
                deadline=Deadline(base_s=2.0, cold_s=0.0, grace_s=0.5),
            )
        case = Case(
            attention=AttentionConfig(num_qo_heads=2, num_kv_heads=1, head_dim=16, page_size=4),
            batch=BatchSpec(mode="target_verify", prefix_lens=(5, 9), q_len=3),
            seed=seed,
        )
        for r in made[path].evaluate(case).findings():
            pytest.fail(f"{{r.path}} {{r.outcome.value}}: {{r.reason}}", pytrace=False)

    yield run
    for executor in made.values():
        executor.close()
"""

TESTS = """
import pytest


@pytest.mark.parametrize(("path", "seed"), {params!r})
def test_kernel(run_case, path, seed):
    run_case(path, seed)
"""

FIRST = [("good-sdpa", 1), ("bad-abort", 2), ("good-sdpa", 3), ("bad-hang", 4), ("torch-sdpa", 5)]
SECOND = [("good-sdpa", 6), ("bad-segfault", 7), ("good-sdpa", 8)]


@pytest.mark.slow  # two xdist workers, each with isolated workers
def test_only_the_crashing_and_hanging_cases_fail_under_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(CONFTEST.format(plugin=str(PLUGIN)))
    pytester.makepyfile(
        test_first=TESTS.format(params=FIRST), test_second=TESTS.format(params=SECOND)
    )
    # loadfile: each file runs in order on one xdist worker, so "a later test on the worker
    # that saw the crash" is a fixed test
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", "-v", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=5, failed=3)
    result.stdout.fnmatch_lines_random(
        [
            "bad-abort CRASH: worker process killed by SIGABRT while running this path",
            "bad-segfault CRASH: worker process killed by SIGSEGV while running this path",
            "bad-hang HANG: path bad-hang gave no result within its *s deadline; worker stopped;"
            " it was in _hang (fixtures/bad_paths.py:*)",
            "*3 failed, 5 passed*",
        ]
    )
    verdicts = {}
    for line in result.outlines:  # "[gw0] [ 25%] PASSED test_first.py::test_kernel[...]"
        found = VERDICT.match(line)
        if found:
            verdicts[found.group(3)] = (found.group(1), found.group(2))
    expected = {
        f"test_{name}.py::test_kernel[{path}-{seed}]": "FAILED"
        if path.startswith("bad")
        else "PASSED"
        for name, params in (("first", FIRST), ("second", SECOND))
        for path, seed in params
    }
    assert {test: verdict for test, (_, verdict) in verdicts.items()} == expected
    # each file stayed on one xdist worker: the crashes did not take a worker down
    for name in ("first", "second"):
        workers = {gw for test, (gw, _) in verdicts.items() if test.startswith(f"test_{name}")}
        assert len(workers) == 1
    result.stdout.no_fnmatch_line("*worker*crashed*")  # xdist's own "worker crashed" report
