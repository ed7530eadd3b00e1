"""``difftest export``: a standalone script (torch only, no difftest) that reproduces a finding."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from _planted import corpus_repro, one_torch_thread, planted_fixture  # noqa: F401

from difftest.interfaces.cli import main
from difftest.model.outcome import Outcome
from difftest.records.export import ExportError, export_script
from difftest.records.repro import Finding, load_repro
from difftest.records.source_bundle import Bundle, free_names

PROJECT_IMPORT = re.compile(r"^\s*(import|from)\s+(difftest|oracles|generators)\b", re.M)


def run_isolated(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -I``: no PYTHONPATH, no user site, no script folder on the path, so difftest
    cannot be imported."""
    return subprocess.run(
        [sys.executable, "-I", str(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
    )


def test_the_exported_planted_bug_fails_without_difftest(
    tmp_path: Path, planted: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    file = corpus_repro("planted-page-stride", tmp_path)
    script = tmp_path / "repro.py"
    assert main(["export", str(file), "-o", str(script)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {script}")
    text = script.read_text()
    assert not PROJECT_IMPORT.search(text)
    assert "def run_page_stride(batch" in text  # the kernel itself, copied
    clean = tmp_path / "clean"
    clean.mkdir()
    proc = run_isolated(script, clean)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "oracle recomputed here: max |diff| from the embedded reference 0"
    assert lines[-2].startswith("request 1: max |err| ") and "(rows [1], heads [0])" in lines[-2]
    assert lines[-1] == "FAIL: 1 of 2 requests over tolerance"


def test_a_correct_kernel_exported_from_the_same_case_passes(
    tmp_path: Path, planted: ModuleType
) -> None:
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    for path in ("torch-paged-online", planted.FIXED):
        moved = dataclasses.replace(repro, finding=Finding(path=path, kind=Outcome.WRONG))
        script = tmp_path / f"{path}.py"
        script.write_text(export_script(moved))
        proc = run_isolated(script, tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "PASS"


def test_flashinfer_paths_export_the_adapter_call(tmp_path: Path, planted: ModuleType) -> None:
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    calls = {
        "fi-decode-xqa": "decode_kwargs(batch, workspace, 'xqa')",
        "fi-context-fmha-v2": "flashinfer.prefill.trtllm_fmha_v2_prefill",
        "fi-prefill-fa3": "BatchPrefillWithPagedKVCacheWrapper(",
        "fi-decode-wrapper": "_decode_qlen_arg(flashinfer)",
    }
    for path, call in calls.items():
        moved = dataclasses.replace(repro, finding=Finding(path=path, kind=Outcome.WRONG))
        text = export_script(moved)
        compile(text, path, "exec")
        assert call in text and "DEFAULT_DEVICE = 'cuda'" in text
        assert not PROJECT_IMPORT.search(text)


def test_unexportable_inputs_are_one_line_errors(tmp_path: Path, planted: ModuleType) -> None:
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    planted.register_planted("t-lambda", lambda batch: batch, "a lambda")
    try:
        with pytest.raises(ExportError, match="lambda or a closure"):
            export_script(
                dataclasses.replace(repro, finding=Finding(path="t-lambda", kind=Outcome.WRONG))
            )
    finally:
        from difftest.paths import unregister

        unregister("t-lambda")
    with pytest.raises(ExportError, match="pending repro"):
        export_script(dataclasses.replace(repro, finding=None, status="running"))


def test_free_names_skip_annotations_locals_and_arguments() -> None:
    import ast

    tree = ast.parse(
        "def f(x: Batch, y=DEFAULT) -> Out:\n"
        "    z: Local = helper(x) + GLOBAL\n"
        "    return [w for w in z] + other\n"
    )
    assert free_names(tree.body[0]) == ["DEFAULT", "helper", "GLOBAL", "other"]


def test_a_bundle_copies_project_code_and_imports_packages() -> None:
    bundle = Bundle()
    bundle.require_name("Case", "difftest.model.case")
    source, imports = bundle.source(), bundle.imports()
    assert "class Case:" in source and "class InvalidCase(DifftestError, ValueError):" in source
    # dependencies come first: DifftestError before InvalidCase before Case
    assert source.index("class DifftestError") < source.index("class InvalidCase")
    assert source.index("class InvalidCase") < source.index("class Case:")
    assert "import hashlib" in imports and "from typing import Literal" in imports
    assert "difftest" not in imports
