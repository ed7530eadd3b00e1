"""Warmup: the builds a campaign needs (one per compiled module) and the command running them."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _planted import one_torch_thread  # noqa: F401  (autouse: one torch thread)

from difftest.campaign.planning import CampaignConfig, planned_cases
from difftest.execution.warmup import builds, cases_of_variants, warm_up
from difftest.generation.materialize import materialize
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import CPU_LIMITS, cases
from difftest.model.batch import Batch
from difftest.model.case import Case
from difftest.paths import flashinfer_context as ctx
from difftest.paths import flashinfer_decode as dec
from difftest.paths import flashinfer_wrappers as wrp
from difftest.paths import get_path, kernel_args, register, unregister
from difftest.paths.registry import KernelPath

CPU = torch.device("cpu")
SAMPLE = sample_cases(cases(limits=CPU_LIMITS), seed=7, count=60)


def planned(cases_per_variant: int, count: int) -> list[Case]:
    config = CampaignConfig(seed=0, cases_per_variant=cases_per_variant)
    return [c for _, c in itertools.islice(planned_cases(config, "cpu"), count)]


@pytest.fixture(name="counting_paths")
def counting_paths_fixture() -> Iterator[dict[str, list[Case]]]:
    """Two registered paths that record the cases they run: ``by-head-dim`` builds one module
    per head dim, ``per-variant`` keeps the default key (the compile variant)."""
    seen: dict[str, list[Case]] = {"by-head-dim": [], "per-variant": []}

    def recorder(name: str):  # type: ignore[no-untyped-def]
        def run(batch: Batch) -> torch.Tensor:
            seen[name].append(batch.case)
            return batch.new_output()

        return run

    register(
        KernelPath(
            name="by-head-dim",
            run=recorder("by-head-dim"),
            build_key=lambda case: case.attention.head_dim,
            supports=lambda case, device: None if case.attention.head_dim != 96 else "no d96",
        )
    )
    register(KernelPath(name="per-variant", run=recorder("per-variant")))
    yield seen
    unregister("by-head-dim")
    unregister("per-variant")


def test_builds_take_one_case_per_module_in_case_order(
    counting_paths: dict[str, list[Case]],
) -> None:
    paths = [get_path("by-head-dim"), get_path("per-variant")]
    jobs = builds(SAMPLE, paths, CPU)
    by_dim = [c for p, c in jobs if p.name == "by-head-dim"]
    per_variant = [c for p, c in jobs if p.name == "per-variant"]
    # one build per head dim the path supports, each the first case that needs it
    dims = list(dict.fromkeys(c.attention.head_dim for c in SAMPLE if c.attention.head_dim != 96))
    assert [c.attention.head_dim for c in by_dim] == dims
    for c in by_dim:
        assert SAMPLE.index(c) == min(
            i for i, s in enumerate(SAMPLE) if s.attention.head_dim == c.attention.head_dim
        )
    # the default key is the compile variant
    firsts = {c.compile_variant(): c for c in reversed(SAMPLE)}
    assert per_variant == sorted(firsts.values(), key=SAMPLE.index)
    # case order: a job never comes before a job of an earlier case
    order = [SAMPLE.index(c) for _, c in jobs]
    assert order == sorted(order)


def test_warm_up_runs_each_module_once(counting_paths: dict[str, list[Case]]) -> None:
    paths = [get_path("by-head-dim"), get_path("per-variant")]
    results = warm_up(SAMPLE, paths, CPU, jobs=2)
    assert all(r.error == "" for r in results)
    assert len(results) == len(builds(SAMPLE, paths, CPU))
    dims = [c.attention.head_dim for c in counting_paths["by-head-dim"]]
    assert len(dims) == len(set(dims)) and 96 not in dims
    variants = [c.compile_variant() for c in counting_paths["per-variant"]]
    assert len(variants) == len(set(variants)) == len({c.compile_variant() for c in SAMPLE})


def test_eager_paths_warm_up_once() -> None:
    jobs = builds(SAMPLE, [get_path("torch-sdpa"), get_path("torch-paged-online")], CPU)
    assert [(p.name, c) for p, c in jobs] == [
        ("torch-sdpa", SAMPLE[0]),
        ("torch-paged-online", SAMPLE[0]),
    ]


def test_cases_of_variants_keeps_runtime_variations_and_stops_at_a_further_variant() -> None:
    plan = planned(cases_per_variant=4, count=64)
    kept = cases_of_variants(plan, limit=2)
    variants = list(dict.fromkeys(c.compile_variant() for c in plan))
    assert {c.compile_variant() for c in kept} == set(variants[:2])
    assert kept == plan[: len(kept)]
    assert plan[len(kept)].compile_variant() not in set(variants[:2])
    assert cases_of_variants(plan, limit=len(plan)) == plan


def _fmha_v2_layout(case: Case) -> str:
    return str(kernel_args.fmha_v2_kwargs(materialize(case, CPU), torch.zeros(8))["input_layout"])


@pytest.mark.parametrize("storage", ["hnd", "nhd", "kv_split_nhd"])
@pytest.mark.parametrize("convention", ["sglang", "plain"])
def test_fmha_v2_build_key_names_the_layout_the_arguments_use(
    storage: str, convention: str
) -> None:
    base = SAMPLE[0]
    case = dataclasses.replace(
        base,
        convention=convention,  # type: ignore[arg-type]
        pool=dataclasses.replace(base.pool, kv_storage=storage),  # type: ignore[arg-type]
    )
    layout = ctx.fmha_v2_build_key(case)[0]
    if convention == "sglang" and storage == "kv_split_nhd":
        with pytest.raises(ValueError, match="split K/V"):
            _fmha_v2_layout(case)
    else:
        assert _fmha_v2_layout(case) == f"Q_PAGED_KV_{layout}"


def test_flashinfer_build_keys_follow_the_module_parameters() -> None:
    case = SAMPLE[0]
    a = case.attention
    # XQA: one module per L and GQA ratio, not per draft shape or storage
    assert dec.xqa_build_key(case) != dec.xqa_build_key(
        dataclasses.replace(case, batch=dataclasses.replace(case.batch, q_len=case.batch.q_len + 1))
    )
    assert dec.xqa_build_key(case) == dec.xqa_build_key(
        dataclasses.replace(case, pool=dataclasses.replace(case.pool, kv_storage="hnd"))
    )
    # fa2/fa3: page size and GQA are runtime; head dim, window and sinks are compiled
    other_page = dataclasses.replace(a, page_size=a.page_size * 2)
    assert wrp.wrapper_build_key(case) == wrp.wrapper_build_key(
        dataclasses.replace(case, attention=other_page)
    )
    with_sinks = dataclasses.replace(a, sinks=not a.sinks)
    assert wrp.wrapper_build_key(case) != wrp.wrapper_build_key(
        dataclasses.replace(case, attention=with_sinks)
    )
    for name, key in [
        ("fi-decode-xqa", dec.xqa_build_key),
        ("fi-context-fmha-v2", ctx.fmha_v2_build_key),
        ("fi-prefill-fa2", wrp.wrapper_build_key),
        ("fi-prefill-fa3", wrp.wrapper_build_key),
        ("fi-decode-wrapper", wrp.wrapper_build_key),
    ]:
        assert get_path(name).module_key(case) == key(case)


def test_warmup_command_builds_each_module_once(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "difftest", "warmup", "--device", "cpu", "--variants", "3",
         "--paths", "torch-sdpa,torch-paged-online", "--cases-per-variant", "4"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["torch-sdpa", "torch-paged-online"]
    assert all(line.split()[-1] == "ok" for line in lines[:2])
    assert lines[-1].startswith("2 builds for 3 variants in ") and lines[-1].endswith(" 0 failed")


def test_warmup_of_repros_builds_what_their_cases_need(
    counting_paths: dict[str, list[Case]], tmp_path: Path
) -> None:
    """``--repro`` takes a corpus folder and repro files: one build per module their cases need
    (one per head dim for a path keyed by it), and a bad file is exit 2."""
    from difftest.interfaces.cli import main
    from difftest.records.corpus import DEFAULT_CORPUS, entries
    from difftest.records.repro import load_repro

    corpus = [load_repro(e.repro_file).case for e in entries(DEFAULT_CORPUS)]
    code = main(["warmup", "--device", "cpu", "--paths", "by-head-dim,per-variant",
                 "--repro", str(DEFAULT_CORPUS)])  # fmt: skip
    assert code == 0
    head_dims = {c.attention.head_dim for c in corpus if c.attention.head_dim != 96}
    assert sorted({c.attention.head_dim for c in counting_paths["by-head-dim"]}) == sorted(
        head_dims
    )
    assert len(counting_paths["by-head-dim"]) == len(head_dims)
    variants = {c.compile_variant() for c in corpus}
    assert len(counting_paths["per-variant"]) == len(variants)
    bad = tmp_path / "bad.repro.json"
    bad.write_text("{")
    assert main(["warmup", "--device", "cpu", "--paths", "per-variant", "--repro", str(bad)]) == 2


KILLER = """
import os, signal
from difftest.paths import KernelPath, register


def run(batch):
    os.kill(os.getpid(), signal.SIGKILL)  # a build that dies, as one killed or out of memory


register(KernelPath(name="dies-building", run=run))
"""


def test_a_build_process_that_dies_is_a_failed_build_not_a_traceback(tmp_path: Path) -> None:
    plugin = tmp_path / "killer.py"
    plugin.write_text(KILLER)
    proc = subprocess.run(
        [sys.executable, "-m", "difftest", "warmup", "--device", "cpu", "--variants", "1",
         "--plugin", str(plugin), "--paths", "dies-building", "--processes", "--jobs", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("dies-building") and "its build process died" in first
    assert proc.stdout.rstrip().endswith("1 failed")


SLOW = """
import pathlib, time
from difftest.paths import KernelPath, register

MARK = pathlib.Path(__file__).with_name("started")


def run(batch):
    MARK.touch()
    time.sleep(3)
    return batch.new_output()


register(KernelPath(name="slow-building", run=run, build_key=lambda case: case.digest()))
"""


def _interrupted_warmup(tmp_path: Path, *, whole_group: bool) -> tuple[int, str, str]:
    """A warmup of three slow builds, one at a time, sent SIGTERM while the first runs: to the
    command alone, or to its whole process group (as ``timeout`` and a terminal send it, so its
    build process gets it too). Its exit code, stdout and stderr."""
    import os
    import signal
    import time

    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW)
    proc = subprocess.Popen(
        [sys.executable, "-m", "difftest", "warmup", "--device", "cpu", "--variants", "3",
         "--plugin", str(plugin), "--paths", "slow-building", "--processes", "--jobs", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting for an event (the first build began), not measuring speed
    if whole_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def test_an_interrupted_warmup_drops_the_builds_not_started_and_exits_1(tmp_path: Path) -> None:
    code, out, err = _interrupted_warmup(tmp_path, whole_group=False)
    assert code == 1, err
    assert "Traceback" not in err
    assert "interrupted (SIGTERM): " in out
    assert int(out.split("interrupted (SIGTERM): ")[1].split()[0]) >= 2  # of 3 builds


def test_a_warmup_interrupted_with_its_build_processes_counts_them_stopped_not_failed(
    tmp_path: Path,
) -> None:
    """The build process dies with the parent's interrupt, and the pool fails every build not
    finished. Those builds were stopped, not failed: none is listed as failed, all are counted
    as not done."""
    code, out, err = _interrupted_warmup(tmp_path, whole_group=True)
    assert code == 1, err
    assert "Traceback" not in err
    assert "failed:" not in out, out
    assert " 0 failed" in out
    assert "interrupted (SIGTERM): 3 build(s) not done" in out, out


@pytest.mark.parametrize("flag", ["--graph", "--ragged", "--skip-softmax"])
def test_warmup_with_a_mode_flag_builds_for_the_variants_that_run_draws(
    flag: str, counting_paths: dict[str, list[Case]]
) -> None:
    """A run with a mode flag draws other templates than a plain run; warmup with the same flag
    builds for that run's variants (those of its planner), not for a plain run's."""
    from difftest.generation.modes import Modes
    from difftest.interfaces.cli import main

    modes = Modes(
        graph=flag == "--graph", ragged=flag == "--ragged", skip_softmax=flag == "--skip-softmax"
    )

    path = get_path("per-variant")

    def variants(config: CampaignConfig) -> set[str]:  # what warmup can build of the plan
        plan = (c for _, c in planned_cases(config, "cpu", paths=[path]))
        return {
            c.compile_variant() for c in cases_of_variants(plan, 3) if path.support(c, CPU) is None
        }

    want = variants(CampaignConfig(seed=0, modes=modes))
    assert want != variants(CampaignConfig(seed=0))  # else the flag would not be tested
    code = main(["warmup", "--device", "cpu", "--paths", "per-variant", "--variants", "3", flag])
    assert code == 0
    assert {c.compile_variant() for c in counting_paths["per-variant"]} == want


def test_warmup_refuses_mode_flags_and_limits_with_repro() -> None:
    from difftest.interfaces.cli import main
    from difftest.records.corpus import DEFAULT_CORPUS

    for extra in (["--graph"], ["--limits", "small"]):
        args = ["warmup", "--device", "cpu", "--repro", str(DEFAULT_CORPUS), *extra]
        assert main(args) == 2
