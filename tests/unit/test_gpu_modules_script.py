"""The GPU scripts under ci/, run against a stand-in ``flashinfer`` package (the scripts read only
its version and JIT directories): ci/gpu_modules.sh, which carries compiled FlashInfer modules
between machines; a plain run of ci/h200_build_modules.sh from a checkout without the device
conventions (no ``.gpu/``, no ``$OUT``); and ci/device_runner.sh, which holds those conventions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "gpu_modules.sh"
TAG = "flashinfer-0.6.16.post4-90a"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("xz") is None, reason="needs bash and xz"
)


def fake_flashinfer(root: Path) -> Path:
    """A package with flashinfer's version and the three directories the script uses."""
    pkg = root / "site" / "flashinfer"
    workspace = root / "cache" / "0.6.16.post4" / "90a"
    (pkg / "jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.6.16.post4"\n')
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "env.py").write_text(
        "import pathlib\n"
        f"FLASHINFER_WORKSPACE_DIR = pathlib.Path({str(workspace)!r})\n"
        "FLASHINFER_JIT_DIR = FLASHINFER_WORKSPACE_DIR / 'cached_ops'\n"
        f"FLASHINFER_AOT_DIR = pathlib.Path({str(pkg / 'data' / 'aot')!r})\n"
    )
    return root / "site"


def compiled(root: Path, names: tuple[str, ...] = ("mod_a", "mod_b")) -> None:
    """Libraries in the stand-in's JIT cache, as FlashInfer leaves them after compiling."""
    ops = root / "cache" / "0.6.16.post4" / "90a" / "cached_ops"
    for name in names:
        (ops / name).mkdir(parents=True)
        (ops / name / f"{name}.so").write_bytes(name.encode() * 1000)
        (ops / name / f"{name}.cuda.o").write_bytes(b"object")  # not a library: left behind


def plain_env(site: Path, **extra: str) -> dict[str, str]:
    """This environment without the device conventions, with the stand-in on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DIFFTEST_GPU_OUT")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3 = this interpreter
    return {**env, **extra}


def script(verb: list[str], cwd: Path, site: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *verb],
        cwd=cwd,
        env=plain_env(site, DIFFTEST_GPU_OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def checkout(root: Path) -> Path:
    """A checkout as a user has it: the ci/ scripts, no .gpu/, no .gpu-modules/."""
    repo = root / "checkout"
    shutil.copytree(ROOT / "ci", repo / "ci", ignore=shutil.ignore_patterns("__pycache__"))
    return repo


@pytest.mark.parametrize("path", sorted((ROOT / "ci").glob("*.sh")), ids=lambda p: p.name)
def test_every_ci_shell_script_parses(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_save_packs_the_jit_libraries_and_restore_installs_them_as_aot(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    compiled(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    saved = script(["save", "fa3"], tmp_path, site, out)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert "saved 2 modules" in saved.stdout
    archive = out / f"{TAG}-fa3.tar.xz"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["mod_a/mod_a.so", "mod_b/mod_b.so"]

    repo = tmp_path / "checkout"
    (repo / ".gpu-modules").mkdir(parents=True)
    shutil.copy(archive, repo / ".gpu-modules")
    shutil.copy(archive, repo / ".gpu-modules" / "flashinfer-0.6.11-90a-old.tar.xz")
    restored = script(["restore"], repo, site, out)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert f"installed {TAG}-fa3.tar.xz: 2 modules" in restored.stdout
    assert "skipped flashinfer-0.6.11-90a-old.tar.xz (built for another version" in restored.stdout
    aot = site / "flashinfer" / "data" / "aot"
    assert (aot / "mod_a" / "mod_a.so").read_bytes() == b"mod_a" * 1000
    assert sorted(p.name for p in aot.iterdir()) == ["mod_a", "mod_b"]


def test_restore_takes_the_folder_of_archives(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    compiled(tmp_path, ("mod_c",))
    kept = tmp_path / "kept"
    assert script(["save", "c"], tmp_path, site, kept).returncode == 0
    restored = script(["restore", str(kept)], tmp_path, site, tmp_path)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert f"installed {TAG}-c.tar.xz: 1 modules" in restored.stdout


def test_save_splits_an_archive_larger_than_the_part_size(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    ops = tmp_path / "cache" / "0.6.16.post4" / "90a" / "cached_ops" / "big"
    ops.mkdir(parents=True)
    (ops / "big.so").write_bytes(os.urandom(3 << 19))  # 1.5 MiB that xz cannot shrink
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "save", "big"],
        cwd=tmp_path,
        env=plain_env(site, DIFFTEST_GPU_OUT=str(out), GPU_MODULES_PART_MB="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    parts = sorted(p.name for p in out.iterdir())
    assert parts == [f"{TAG}-big.tar.xz.part00", f"{TAG}-big.tar.xz.part01"]
    joined = b"".join((out / p).read_bytes() for p in parts)
    (tmp_path / "joined.tar.xz").write_bytes(joined)
    with tarfile.open(tmp_path / "joined.tar.xz") as tar:
        assert tar.getnames() == ["big/big.so"]


def test_save_keeps_only_the_modules_whose_names_match(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    compiled(tmp_path, ("trtllm_fmha_v2_q_paged_kv_hnd_bf16_bf16", "prefill_d64_sm90", "xqa_d64"))
    out = tmp_path / "out"

    def save(only: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), "save", "slow"],
            cwd=tmp_path,
            env=plain_env(site, DIFFTEST_GPU_OUT=str(out), GPU_MODULES_ONLY=only),
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = save("trtllm_fmha_v2|_sm90$")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "saved 2 modules" in done.stdout
    with tarfile.open(out / f"{TAG}-slow.tar.xz") as tar:
        assert sorted(tar.getnames()) == [
            "prefill_d64_sm90/prefill_d64_sm90.so",
            "trtllm_fmha_v2_q_paged_kv_hnd_bf16_bf16/trtllm_fmha_v2_q_paged_kv_hnd_bf16_bf16.so",
        ]
    none = save("^nothing_by_this_name$")
    assert none.returncode == 1
    assert none.stdout.strip().endswith("matching ^nothing_by_this_name$")


def test_save_without_compiled_modules_fails_with_one_line(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    (tmp_path / "cache" / "0.6.16.post4" / "90a" / "cached_ops").mkdir(parents=True)
    proc = script(["save", "x"], tmp_path, site, tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.strip().startswith("gpu_modules: no compiled modules in ")


def test_restore_without_flashinfer_says_so(tmp_path: Path) -> None:
    proc = script(["restore"], tmp_path, tmp_path / "nothing", tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "gpu_modules: flashinfer is not importable"
    assert proc.stderr == ""


def test_build_modules_runs_from_a_plain_checkout_into_a_local_folder(tmp_path: Path) -> None:
    """No .gpu/env.sh, no $OUT: the installed python and flashinfer, output in the checkout."""
    site = fake_flashinfer(tmp_path)
    compiled(tmp_path)
    repo = checkout(tmp_path)
    elsewhere = tmp_path / "elsewhere"  # the script finds its checkout from where it lies
    elsewhere.mkdir()
    knobs = {"PATHS": "torch-sdpa", "NAME": "plain", "PRESETS": "llama-3.1-8b"}
    knobs |= {"PER_VARIANT": "2", "JOBS": "1", "NINJA_JOBS": "1", "HOME": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(repo / "ci" / "h200_build_modules.sh")],
        cwd=elsewhere,
        env=plain_env(site, **knobs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = repo / "difftest-out" / "gpu"
    log = (out / "build.log").read_text()
    assert "gpu: none | torch " in log and "| flashinfer 0.6.16.post4" in log
    assert "1 builds for 1 variants" in log and "exit 0" in log
    assert "gpu_modules: saved 2 modules as " in log
    with tarfile.open(out / f"{TAG}-plain.tar.xz") as tar:
        assert sorted(tar.getnames()) == ["mod_a/mod_a.so", "mod_b/mod_b.so"]
    assert not (repo / ".gpu").exists() and not (repo / ".jit-cache").exists()
    assert list(elsewhere.iterdir()) == []


def test_build_modules_writes_to_the_folder_it_is_given(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    repo = checkout(tmp_path)
    done = subprocess.run(
        ["bash", "ci/h200_build_modules.sh"],
        cwd=repo,
        env=plain_env(site, DIFFTEST_GPU_OUT="mine", PATHS="torch-sdpa"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1  # NAME missing: said before anything runs
    assert "NAME names the archive" in done.stderr
    assert not (repo / "mine").exists()


def test_device_runner_sets_up_the_conventions_then_runs_the_plain_script(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    compiled(tmp_path, ("kept",))
    repo = checkout(tmp_path)
    (repo / ".gpu-modules").mkdir()
    assert script(["save", "kept"], tmp_path, site, repo / ".gpu-modules").returncode == 0
    shutil.rmtree(tmp_path / "cache" / "0.6.16.post4" / "90a" / "cached_ops" / "kept")
    compiled(tmp_path, ("new",))
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "ci/device_runner.sh", "ci/gpu_modules.sh", "save", "new"],
        cwd=repo,
        env=plain_env(site, OUT=str(out), HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # no .gpu/env.sh here: the committed copy, ci/device_env.sh, set the environment up
    assert "no .gpu/env.sh; sourcing ci/device_env.sh" in done.stdout
    assert "gpu: none | torch " in done.stdout
    assert f"gpu_modules: installed {TAG}-kept.tar.xz: 1 modules" in done.stdout
    assert (site / "flashinfer" / "data" / "aot" / "kept" / "kept.so").exists()
    assert (repo / ".jit-cache").is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["device_runner.log", f"{TAG}-new.tar.xz"]


def test_device_runner_sources_a_staged_env_sh(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    (repo / ".gpu").mkdir()
    (repo / ".gpu" / "env.sh").write_text("export STAGED=yes\necho staged env\n")
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", "ci/device_runner.sh", "bash", "-c", 'echo "$STAGED $DIFFTEST_GPU_OUT"'],
        cwd=repo,
        env=plain_env(tmp_path / "nothing", OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "staged env" in done.stdout
    assert done.stdout.splitlines()[-1] == f"yes {out}"


def test_device_runner_stops_when_the_environment_fails(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    (repo / ".gpu").mkdir()
    (repo / ".gpu" / "env.sh").write_text("echo no kit; return 1\n")
    done = subprocess.run(
        ["bash", "ci/device_runner.sh", "bash", "-c", "echo ran"],
        cwd=repo,
        env=plain_env(tmp_path / "nothing", OUT=str(tmp_path / "out")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no kit" in done.stdout and "failed to set up" in done.stdout
    assert "ran" not in done.stdout.splitlines()


def test_device_runner_without_out_says_where_it_belongs(tmp_path: Path) -> None:
    repo = checkout(tmp_path)
    done = subprocess.run(
        ["bash", "ci/device_runner.sh", "ci/h200_campaign.sh", "all"],
        cwd=repo,
        env=plain_env(tmp_path / "nothing"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "$OUT is not set" in done.stderr and "run the script itself" in done.stderr
