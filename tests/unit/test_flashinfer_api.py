"""API detection pinned against the recorded API of real FlashInfer releases.

``tests/data/flashinfer_api/<version>.json`` was recorded from each release's wheel by
``ci/record_flashinfer_api.py`` (parameter lists of the functions and wrapper methods detection
inspects, and the properties the wrappers define). Each test builds a stand-in ``flashinfer``
from a record (functions and methods carrying the recorded signatures, properties where the
class has them) and runs :func:`difftest.paths.flashinfer_api.detect` on it: what the adapters
do on each release follows from these facts, never from the version number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from _api_records import record, stand_in

from difftest.paths.flashinfer_api import FlashInferApi, detect, resolved_backend

ROOT = Path(__file__).resolve().parents[2]


EXPECTED = {
    "0.6.11.post1": FlashInferApi(decode_qlen_arg="run"),
    "0.6.16.post4": FlashInferApi(decode_qlen_arg="plan"),
    "0.6.18": FlashInferApi(decode_qlen_arg="plan", fmha_v2_split_kv=True),
    "0.7.2": FlashInferApi(
        decode_qlen_arg="plan",
        decode_wrapper_reports="resolved_backend",
        context_backend_arg=True,
        fmha_v2_split_kv=True,
        cake=True,
    ),
    "0.7.4": FlashInferApi(
        decode_qlen_arg="plan",
        decode_wrapper_reports="resolved_backend",
        context_backend_arg=True,
        fmha_v2_split_kv=True,
        cake=True,
    ),
}


@pytest.mark.parametrize("version", sorted(EXPECTED))
def test_detection_on_each_recorded_release(version: str) -> None:
    assert detect(stand_in(record(version))) == EXPECTED[version]


def test_q_len_per_req_moves_from_run_to_plan_through_the_forwarded_plan_impl() -> None:
    old, new = record("0.6.11.post1"), record("0.6.16.post4")
    wrapper = "BatchDecodeWithPagedKVCacheWrapper"
    names = {
        v: [p[0] for p in r["classes"][wrapper]["methods"]["plan"]]
        for v, r in (("old", old), ("new", new))
    }
    assert "q_len_per_req" not in names["old"] and "q_len_per_req" not in names["new"]
    assert "kwargs" in names["new"]  # plan(**kwargs) forwards to the keyword-only _plan_impl
    impl = [p for p in new["classes"][wrapper]["methods"]["_plan_impl"] if p[0] == "q_len_per_req"]
    assert impl == [["q_len_per_req", "KEYWORD_ONLY", "1"]]


def test_the_decode_wrapper_backend_is_read_where_each_release_reports_it() -> None:
    for version, api in EXPECTED.items():
        cls = stand_in(record(version)).BatchDecodeWithPagedKVCacheWrapper
        wrapper = object.__new__(cls)  # the recorded __init__ is a signature only
        wrapper._backend = "xqa"  # what a plan could leave behind
        reported = resolved_backend(wrapper)
        if api.decode_wrapper_reports == "resolved_backend":
            assert reported == "fa2", version  # the property, not the private attribute
        else:
            assert reported == "xqa", version


def test_a_missing_library_surface_claims_nothing() -> None:
    assert detect(ModuleType("flashinfer")) == FlashInferApi(decode_qlen_arg=None)
    assert resolved_backend(SimpleNamespace()) is None


def test_the_records_are_what_the_recorder_writes(tmp_path: Path) -> None:
    """The recorder reproduces a record from sources shaped like a wheel's (a synthetic one:
    the wheels are not in the repository)."""
    fi = tmp_path / "flashinfer"
    fi.mkdir()
    (fi / "_build_meta.py").write_text('__version__ = "9.9.9"\n')
    (fi / "__init__.py").write_text(
        "from .decode import (\n"
        "    BatchDecodeWithPagedKVCacheWrapper as BatchDecodeWithPagedKVCacheWrapper,\n"
        ")\n"
    )
    (fi / "decode.py").write_text(
        "class BatchDecodeWithPagedKVCacheWrapper:\n"
        "    def __init__(self, ws, kv_layout='NHD', *, backend='auto'): ...\n"
        "    def plan(self, indptr, *args, **kwargs): ...\n"
        "    def _plan_impl(self, indptr, *, q_len_per_req=1): ...\n"
        "    @property\n"
        "    def resolved_backend(self): ...\n"
        "def trtllm_batch_decode_with_kv_cache(query, kv_cache, backend='auto'): ...\n"
    )
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "record_flashinfer_api.py"), str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["version"] == "9.9.9"
    assert data["exports"] == ["BatchDecodeWithPagedKVCacheWrapper"]
    cls = data["classes"]["BatchDecodeWithPagedKVCacheWrapper"]
    assert cls["properties"] == ["resolved_backend"]
    assert cls["methods"]["__init__"] == [
        ["self", "POSITIONAL_OR_KEYWORD", None],
        ["ws", "POSITIONAL_OR_KEYWORD", None],
        ["kv_layout", "POSITIONAL_OR_KEYWORD", "'NHD'"],
        ["backend", "KEYWORD_ONLY", "'auto'"],
    ]
    api = detect(stand_in(data))
    assert api.decode_qlen_arg == "plan" and api.decode_wrapper_reports == "resolved_backend"
    assert not (api.context_backend_arg or api.fmha_v2_split_kv or api.cake)
