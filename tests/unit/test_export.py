"""``difftest export``: a standalone script (torch only, no difftest) that reproduces a finding."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from _planted import ROOT, corpus_repro, one_torch_thread, planted_fixture  # noqa: F401

from difftest.execution.evaluate import evaluate
from difftest.generation.materialize import materialize
from difftest.interfaces.cli import main
from difftest.judgement.tolerance import Tolerance
from difftest.model.batch import Batch
from difftest.model.case import AttentionConfig, BatchSpec, Case, CausalDraft, PoolSpec, TreeDraft
from difftest.model.outcome import Outcome
from difftest.paths import all_paths, get_path
from difftest.paths import flashinfer_context as ctx
from difftest.paths import flashinfer_decode as dec
from difftest.paths import flashinfer_env as fienv
from difftest.paths import flashinfer_wrappers as wrp
from difftest.paths import flashinfer_xqa_ragged as xr
from difftest.paths.flashinfer_api import FlashInferApi
from difftest.records.export import ExportError, export_script
from difftest.records.repro import Finding, Repro, load_repro
from difftest.records.source_bundle import Bundle, free_names

PROJECT_IMPORT = re.compile(r"^\s*(import|from)\s+(difftest|oracles|generators)\b", re.M)
FAKE_FLASHINFER = ROOT / "tests" / "fixtures" / "fake_flashinfer"
H200 = fienv.FlashInferEnv(device_type="cuda", capability=(9, 0), version="0.6.16.post4")
B200 = dataclasses.replace(H200, capability=(10, 0))
NEWER = FlashInferApi(decode_qlen_arg="plan", fmha_v2_split_kv=True, cake=True)
"""A release with the (k, v) FMHAv2 form and cake (as 0.7.2 and 0.7.4 have)."""
WRAPPERS = {
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchAttentionWithAttentionSinkWrapper",
    "BatchDecodeWithPagedKVCacheWrapper",
}
FAKE_CALLS = {
    "fi-decode-xqa": {"decode"},
    "fi-decode-trtllm-gen": {"decode"},
    "fi-decode-cake": {"decode"},
    "fi-context-trtllm-gen": {"prefill"},
    "fi-context-fmha-v2": {"prefill"},
    "fi-prefill-fa2": WRAPPERS,
    "fi-prefill-fa3": WRAPPERS,
    "fi-decode-wrapper": WRAPPERS,
}
"""What each path calls in the fake (a module, or a wrapper class and its methods)."""


# Runs a script as ``python script.py ARGS`` would, with the project's packages unimportable
# (the editable install's finder would otherwise still find difftest under ``python -I``).
_BLOCKED_RUN = """
import importlib.abc, runpy, sys

class NoProject(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("difftest", "oracles", "generators"):
            raise ImportError(f"a standalone script imported {name}")
        return None

sys.meta_path.insert(0, NoProject())
extra, script, *args = sys.argv[1:]
if extra:
    sys.path.insert(0, extra)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


def run_isolated(
    script: Path,
    cwd: Path,
    *args: str,
    path: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -I`` (no PYTHONPATH, no user site, no script folder on the path) with
    difftest, oracles and generators made unimportable; ``path`` goes first on the module
    path."""
    return subprocess.run(
        [sys.executable, "-I", "-c", _BLOCKED_RUN, str(path or ""), str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        },
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
    # the verdict is difftest's own (judge, copied), word for word
    repro = load_repro(file)
    assert repro.finding is not None
    tolerance = Tolerance()
    verdict = evaluate(repro.case, [get_path(repro.finding.path)], tolerance=tolerance).results[0]
    assert verdict.outcome is Outcome.WRONG
    assert lines[-1] == f"FAIL: WRONG: {verdict.reason}"
    assert verdict.reason.startswith("1 of 2 requests over tolerance; request 1: ")


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


def _one_inf(batch: Batch) -> torch.Tensor:
    """Every row written, one element infinite (module level: export copies it)."""
    out = torch.zeros(batch.q.shape, dtype=batch.out_dtype, device=batch.device)
    out[0, 0, 0] = float("inf")
    return out


def test_the_script_judges_as_difftest_does(tmp_path: Path, planted: ModuleType) -> None:
    # a non-finite output is NONFINITE for difftest; the script says so too
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    planted.register_planted("t-one-inf", _one_inf, "one infinite element")
    try:
        moved = dataclasses.replace(repro, finding=Finding(path="t-one-inf", kind=Outcome.WRONG))
        script = tmp_path / "inf.py"
        script.write_text(export_script(moved))
        verdict = evaluate(repro.case, [get_path("t-one-inf")]).results[0]
    finally:
        from difftest.paths import unregister

        unregister("t-one-inf")
    assert verdict.outcome is Outcome.NONFINITE
    proc = run_isolated(script, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == f"FAIL: NONFINITE: {verdict.reason}"


FI_CALLS = {
    "fi-decode-xqa": dec.call_trtllm_decode,
    "fi-decode-trtllm-gen": dec.call_trtllm_decode,
    "fi-decode-cake": dec.call_trtllm_decode,
    "fi-context-trtllm-gen": ctx.call_trtllm_context,
    "fi-context-fmha-v2": ctx.call_fmha_v2,
    "fi-prefill-fa2": wrp.call_prefill_wrapper,
    "fi-prefill-fa3": wrp.call_prefill_wrapper,
    "fi-decode-wrapper": wrp.call_decode_wrapper,
    "fi-xqa-ragged": xr.call_xqa_ragged,
}
"""Each FlashInfer path's kernel call: what its ``run`` and its ``standalone`` both call."""


def test_flashinfer_paths_export_the_adapter_source(tmp_path: Path, planted: ModuleType) -> None:
    repro = load_repro(corpus_repro("planted-page-stride", tmp_path))
    assert set(FI_CALLS) == {p.name for p in all_paths() if "flashinfer" in p.tags}
    for name, call in FI_CALLS.items():
        path = get_path(name)
        assert path.standalone is not None
        moved = dataclasses.replace(repro, finding=Finding(path=name, kind=Outcome.WRONG))
        text = export_script(moved)
        compile(text, name, "exec")
        # the adapter's own functions, verbatim, not a re-typed copy
        for fn in (path.standalone, call):
            assert inspect.getsource(fn) in text, (name, fn.__name__)
        assert f"def kernel(batch):\n    return {path.standalone.__name__}(batch)\n" in text
        assert "DEFAULT_DEVICE = 'cuda'" in text
        assert not PROJECT_IMPORT.search(text)
        # what only difftest's process has stays out: contracts, caches, the probe
        for absent in ("check_decode_args", "check_context_args", "_WORKSPACES", "_WRAPPERS"):
            assert absent not in text, (name, absent)
        assert "probe_env" not in text and "FlashInferEnv" not in text


def _fi_case(
    L: int = 4,
    *,
    tree: bool = False,
    storage: str = "kv_split_nhd",
    convention: str = "sglang",
    mode: str = "target_verify",
    padding_rows: int = 0,
    **attn: Any,
) -> Case:
    """A small case a FlashInfer path supports (checked in the test)."""
    fields = {"num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16} | attn
    draft = TreeDraft(parents=(-1, *[i // 2 for i in range(L - 1)])) if tree else CausalDraft()
    return Case(
        attention=AttentionConfig(**fields),
        batch=BatchSpec(
            mode=mode,  # type: ignore[arg-type]
            prefix_lens=(21, 3),
            q_len=L,
            draft=draft,
            padding_rows=padding_rows,
        ),
        pool=PoolSpec(kv_storage=storage),  # type: ignore[arg-type]
        convention=convention,  # type: ignore[arg-type]
        seed=5,
    )


FP8 = {"kv_dtype": "fp8_e4m3", "k_scale": 0.5, "v_scale": 0.25}
SINKS = {"sinks": True, "window_left": 9}
CALL_CASES = [
    ("fi-decode-xqa", "tree", _fi_case(tree=True), "plan"),
    ("fi-decode-xqa", "fp8-sinks-plain", _fi_case(convention="plain", **FP8, **SINKS), "plan"),
    ("fi-decode-trtllm-gen", "fp8-hnd", _fi_case(3, storage="hnd", **FP8), "plan"),
    ("fi-context-trtllm-gen", "padded-nhd", _fi_case(storage="nhd", padding_rows=3), "plan"),
    ("fi-context-fmha-v2", "plain-window", _fi_case(convention="plain", window_left=7), "plan"),
    ("fi-context-fmha-v2", "fp8-hnd", _fi_case(2, storage="hnd", **FP8), "plan"),
    ("fi-context-fmha-v2", "sglang-split-kv", _fi_case(3), "split"),
    ("fi-decode-cake", "nhd", _fi_case(storage="nhd"), "plan"),
    ("fi-prefill-fa2", "tree", _fi_case(tree=True), "plan"),
    ("fi-prefill-fa2", "fp8-sinks", _fi_case(storage="hnd", **FP8, **SINKS), "plan"),
    ("fi-prefill-fa3", "sinks-plain", _fi_case(convention="plain", **SINKS), "plan"),
    ("fi-decode-wrapper", "qlen-at-plan", _fi_case(storage="nhd", **FP8), "plan"),
    ("fi-decode-wrapper", "qlen-at-run", _fi_case(), "run"),
    ("fi-decode-wrapper", "one-token-at-run", _fi_case(1), "run"),
]
"""``(path, label, case, the fake's release)``: where its decode wrapper takes
``q_len_per_req`` (``plan``/``run``), or ``split``: its FMHAv2 takes the ``(k, v)`` tuple."""


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(name="fake_flashinfer")
def fake_flashinfer_fixture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """``tests/fixtures/fake_flashinfer`` imported as flashinfer here (a real one is put back
    afterwards), fresh workspaces and wrappers, a call log; yields the log's file."""

    def ours() -> list[str]:
        return [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]

    saved = {k: sys.modules.pop(k) for k in ours()}
    monkeypatch.syspath_prepend(str(FAKE_FLASHINFER))
    monkeypatch.setattr(fienv, "_WORKSPACES", {})
    monkeypatch.setattr(wrp, "_WRAPPERS", {})
    log = tmp_path / "path-calls.jsonl"
    monkeypatch.setenv("FAKE_FLASHINFER_LOG", str(log))
    try:
        yield log
    finally:
        for k in ours():
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize(
    ("name", "case", "qlen"),
    [
        pytest.param(name, case, qlen, id=f"{name}-{label}")
        for name, label, case, qlen in CALL_CASES
    ],
)
def test_the_exported_script_calls_flashinfer_as_the_path_does(
    name: str,
    case: Case,
    qlen: str,
    fake_flashinfer: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The exported script, run with a recording stand-in for flashinfer, makes exactly the
    calls (constructors, plans, launches; every argument's dtype, shape, strides and bytes)
    that the path makes for the same case in this process, contract checks included."""
    path = get_path(name)
    env = B200 if "trtllm-gen" in name or "cake" in name else H200
    if "cake" in name or qlen == "split":
        env = dataclasses.replace(env, api=NEWER)
    with monkeypatch.context() as m:
        m.setattr(fienv, "probe_env", lambda device: env)
        assert path.support(case, torch.device("cuda")) is None
    monkeypatch.setenv("FAKE_FLASHINFER_QLEN", "plan" if qlen == "split" else qlen)
    monkeypatch.setenv("FAKE_FLASHINFER_SPLIT_KV", "1" if qlen == "split" else "0")
    out = path.run(materialize(case))
    assert out.shape == (case.batch.num_query_rows, case.attention.num_qo_heads, 64)
    by_path = _calls(fake_flashinfer)
    assert by_path and all(c["call"].split(".")[0] in FAKE_CALLS[name] for c in by_path)

    repro = Repro(
        case=case, status="finding", paths=(name,), finding=Finding(path=name, kind=Outcome.WRONG)
    )
    script = tmp_path / "repro.py"
    script.write_text(export_script(repro))
    log = tmp_path / "script-calls.jsonl"
    run_env = {
        "FAKE_FLASHINFER_LOG": str(log),
        "FAKE_FLASHINFER_QLEN": "plan" if qlen == "split" else qlen,
        "FAKE_FLASHINFER_SPLIT_KV": "1" if qlen == "split" else "0",
    }
    clean = tmp_path / "clean"
    clean.mkdir()
    proc = run_isolated(script, clean, "--device", "cpu", path=FAKE_FLASHINFER, env=run_env)
    # the fake writes no output: every row stays NaN
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rows never written" in proc.stdout.splitlines()[-1]
    assert _calls(log) == by_path


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
