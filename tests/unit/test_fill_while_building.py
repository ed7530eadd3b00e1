"""While a launch's modules build, a campaign runs more runtime variations of the variants
already built instead of leaving the device idle (``CampaignConfig.fill``).

The extra variations come from a seeded stream of their own (:meth:`Planner.extra`): the
same campaign seed, template and turn give the same launch, each of the template's compile
variant, and the planned cases stay what they were. The builds are the ``slow_build``
fixture's, held and let go through files, so nothing here depends on how fast anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _planted import cpu_session, one_torch_thread  # noqa: F401  (autouse: one torch thread)
from test_compile_ahead import PLUGIN, _fake_build_folder, _ran, _until, _variant_id

from difftest.campaign.loop import run_campaign
from difftest.campaign.planning import CampaignConfig, Planner, planned_cases
from difftest.campaign.report import CampaignReport
from difftest.generation.strategies import GPU_LIMITS, SMALL_LIMITS
from difftest.interfaces.commands._campaign_options import add_campaign_arguments, campaign_config
from difftest.model.case import Case


def _kernel_shape(c: Case, storage: str = "hnd") -> tuple[object, ...]:
    """The compile variant with the pool's layout set aside (a template's runtime variations
    keep the rest)."""
    return c.replace(pool=dataclasses.replace(c.pool, kv_storage=storage)).compile_variant()


def _campaign_beside(
    config: CampaignConfig, folder: Path, control: Callable[[], None], **settings: object
) -> CampaignReport:
    """The campaign of ``config`` on ``blocking-build`` (a session of ``settings``), with
    ``control`` holding and letting go its builds in a thread beside it; every build is let
    go when it ends."""
    controller = threading.Thread(target=control)
    controller.start()
    try:
        with cpu_session(("blocking-build",), plugins=(PLUGIN,), **settings) as session:
            return run_campaign(config, session)
    finally:
        (folder / "release-all").write_text("")
        controller.join()


def _first_built_second_held(
    folder: Path, first: str, second: str, seen: dict[str, object]
) -> Callable[[], None]:
    """Control for :func:`_campaign_beside`: variant ``first``'s build let go, ``second``'s
    held until three extra cases of ``first`` ran (``seen``: whether ``second`` was built by
    then, or the error), then every build let go."""

    def control() -> None:
        try:
            _until(lambda: (folder / f"{first}.started").exists(), "build 1 started")
            _until(lambda: (folder / f"{second}.started").exists(), "build 2 started")
            (folder / f"{first}.release").write_text("")
            _until(lambda: _ran(folder).count(first) >= 2 + 3, "three extra cases ran")
            seen["second_built_meanwhile"] = (folder / f"{second}.built").exists()
        except AssertionError as e:
            seen["error"] = str(e)
        finally:
            (folder / "release-all").write_text("")

    return control


def _planner(config: CampaignConfig) -> tuple[Planner, list[Case]]:
    planner = Planner(config, torch.device("cpu"))
    planned = [c for _, c in itertools.islice(iter(planner), 12)]
    return planner, planned


def _two_variants(tmp_path: Path, **overrides: object) -> CampaignConfig:
    """Seed 3's first two compile variants, two cases each, built ahead by two processes
    (the ``slow_build`` fixture's builds), not shrunk, no determinism reruns; ``overrides``
    on top."""
    fields: dict[str, object] = {
        "seed": 3,
        "cases_per_variant": 2,
        "max_variants": 2,
        "compile_ahead": 2,
        "shrink": False,
        "determinism_every": 0,
        "out_dir": tmp_path / "out",
        **overrides,
    }
    return CampaignConfig(**fields)  # type: ignore[arg-type]


def test_extra_launches_are_seeded_of_the_variant_and_apart_from_the_plan() -> None:
    config = CampaignConfig(seed=7, cases_per_variant=3, pack=2)
    planner, planned = _planner(config)
    again, planned_again = _planner(config)
    assert [c.digest() for c in planned] == [c.digest() for c in planned_again]
    first = planned[0]
    launches = [planner.extra(first, k) for k in range(6)]
    for launch in launches:
        assert len(launch) == 2  # a leader and its partner, as packed launches are
        assert len({c.compile_variant() for c in launch}) == 1
        assert {_kernel_shape(c) for c in launch} == {_kernel_shape(first)}
    # the same seed, template and turn give the same launch; the turns differ
    assert [[c.digest() for c in x] for x in launches] == [
        [c.digest() for c in again.extra(first, k)] for k in range(6)
    ]
    leaders = {x[-1].digest() for x in launches}
    assert len(leaders) == 6
    assert not leaders & {c.digest() for c in planned}
    # asking for extras draws nothing from the planned stream
    fresh, _ = _planner(config)
    assert [c.digest() for c in planned] == [
        c.digest() for _, c in itertools.islice(planned_cases(config, "cpu"), 12)
    ]
    # a variant the planner has not expanded has no extras
    other = CampaignConfig(seed=8, cases_per_variant=3)
    _, stranger = _planner(other)
    unknown = [c for c in stranger if c.compile_variant() not in fresh._variants]
    assert unknown, "seed 8 must draw a variant seed 7's first templates do not"
    assert fresh.extra(unknown[0], 0) == []


def test_the_device_runs_built_variants_while_the_next_variant_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variant 1's module is let go, variant 2's held: the campaign runs variant 1's planned
    cases, then extra variations of variant 1 until variant 2 is built, then variant 2's."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    # patience: the launch of variant 2 would wait for its build all along
    config = _two_variants(tmp_path, patience_s=600.0, fill=True)
    planned = [c for _, c in planned_cases(config, "cpu")]
    first, second = dict.fromkeys(_variant_id(c) for c in planned)
    assert [_variant_id(c) for c in planned] == [first, first, second, second]
    seen: dict[str, object] = {}
    control = _first_built_second_held(folder, first, second, seen)
    report = _campaign_beside(config, folder, control)
    assert "error" not in seen, seen.get("error")
    assert seen["second_built_meanwhile"] is False
    ran = _ran(folder)
    extra = ran.count(first) - 2
    assert extra >= 3
    # variant 1's planned and extra cases, then variant 2's two: none ran before its build
    assert ran == [first] * (2 + extra) + [second] * 2
    ahead = report.compile_ahead
    assert ahead is not None and ahead.filled == extra
    assert report.to_json()["compile_ahead"]["filled"] == extra
    assert report.cases == 4 + extra
    assert report.paths["blocking-build"].outcomes == {"AGREE": 4 + extra}
    assert report.stop_reason == "the case list ended"


def test_several_workers_run_built_variants_while_the_next_variant_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a launch pool (Run 27 on the H200: four workers waited 18.4 s of 95.7 on builds,
    none filled): variant 1's module is let go, variant 2's held; the two workers run variant
    1's planned cases, then extra variations of it, and variant 2's cases only once built."""
    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = _two_variants(tmp_path, fill=True, workers=2)
    planned = [c for _, c in planned_cases(config, "cpu")]
    first, second = dict.fromkeys(_variant_id(c) for c in planned)
    seen: dict[str, object] = {}
    control = _first_built_second_held(folder, first, second, seen)
    report = _campaign_beside(config, folder, control, isolation="process")
    assert "error" not in seen, seen.get("error")
    assert seen["second_built_meanwhile"] is False
    ran = _ran(folder)
    extra = ran.count(first) - 2
    assert extra >= 3 and ran.count(second) == 2
    # variant 2 ran only after variant 1's planned cases and three extras (queued extras may
    # still run beside it once its build is let go)
    assert ran.index(second) >= 2 + 3
    ahead = report.compile_ahead
    assert ahead is not None and ahead.filled == extra
    assert report.cases == 4 + extra
    assert report.paths["blocking-build"].outcomes == {"AGREE": 4 + extra}
    assert report.stop_reason == "the case list ended"


def test_extra_cases_that_overfill_one_launch_are_split_as_planned_ones_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 19 on the H200: an extra launch of eight large cases packed into one would hold
    4.46e9 K/V elements, over the cap of one case, and ended the campaign with an invalid
    case. Here three extra cases of 1,500 requests each (any two fit the 4,096-request cap,
    all three do not) must run as two launches (packed: eight planned cases a launch)."""
    from difftest.execution import packing

    folder = _fake_build_folder(tmp_path, monkeypatch)
    config = _two_variants(tmp_path, patience_s=600.0, pack=8, fill=True)
    planned = [c for _, c in planned_cases(config, "cpu")]
    first, _ = dict.fromkeys(_variant_id(c) for c in planned)
    base = next(c for c in planned if _variant_id(c) == first)
    wide = dataclasses.replace(
        base.batch, prefix_lens=(0,) * 1500, padding_requests=0, padding_rows=0
    )
    big = [base.replace(batch=wide, seed=s) for s in (1, 2, 3)]
    assert {_variant_id(c) for c in big} == {first}
    assert not packing.fits_one_launch(big) and packing.fits_one_launch(big[:2])
    monkeypatch.setattr(Planner, "extra", lambda self, case, k: list(big) if k < 1 else [])

    def control() -> None:
        try:
            _until(lambda: (folder / f"{first}.started").exists(), "build 1 started")
            (folder / f"{first}.release").write_text("")
            # the fixture logs a run per launch: variant 1's two planned ones, then an extra
            _until(lambda: _ran(folder).count(first) >= 3, "an extra launch ran")
        finally:
            (folder / "release-all").write_text("")

    report = _campaign_beside(config, folder, control)
    ahead = report.compile_ahead
    assert ahead is not None and ahead.filled == 3
    assert _ran(folder).count(first) == 2 + 2  # the three extra cases in two launches
    assert report.cases == len(planned) + 3
    assert report.paths["blocking-build"].outcomes == {"AGREE": len(planned) + 3}
    assert report.stop_reason == "the case list ended"


def test_without_fill_the_launch_waits_and_runs_only_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _fake_build_folder(tmp_path, monkeypatch)
    (folder / "release-all").write_text("")
    config = _two_variants(tmp_path)
    planned = [_variant_id(c) for _, c in planned_cases(config, "cpu")]
    with cpu_session(("blocking-build",), plugins=(PLUGIN,)) as session:
        report = run_campaign(config, session)
    assert _ran(folder) == planned
    assert report.cases == 4
    assert report.compile_ahead is not None and report.compile_ahead.filled == 0


def _config_of(device: str, *argv: str) -> CampaignConfig:
    parser = argparse.ArgumentParser()
    add_campaign_arguments(parser)
    return campaign_config(parser.parse_args(list(argv)), torch.device(device))


def test_the_command_line_fills_only_budget_bound_gpu_runs() -> None:
    assert _config_of("cuda").fill is True
    assert _config_of("cuda", "--no-fill").fill is False
    # a run with a case count keeps the case list its seed names
    assert _config_of("cuda", "--max-cases", "100").fill is False
    assert _config_of("cpu").fill is False


def test_a_gpu_packs_as_many_cases_as_its_limits_say_and_a_cpu_none() -> None:
    assert GPU_LIMITS.gpu_pack == 8 and SMALL_LIMITS.gpu_pack == 64
    assert _config_of("cuda").pack == 8
    assert _config_of("cuda", "--limits", "gpu").pack == 8
    assert _config_of("cuda", "--limits", "small").pack == 64
    assert _config_of("cuda", "--limits", "small", "--pack", "1").pack == 1
    assert _config_of("cuda", "--limits", "small", "--graph").pack == 1  # one static shape
    assert _config_of("cpu", "--limits", "small").pack == 1
    assert _config_of("cpu", "--pack", "4").pack == 4
    # 64 small cases hold no more requests than one case at the GPU limits may
    assert SMALL_LIMITS.gpu_pack * SMALL_LIMITS.max_requests <= GPU_LIMITS.max_requests
