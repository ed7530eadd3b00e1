"""ci/scale_fingerprint.py and ci/h200_scale_probe.py on the CPU.

The fingerprint pins the corpus's two scale findings: each repro's recorded kernel error is
exactly what the oracle gives with the misuse named in its entry. The probe, written for the
GPU, is run here against the eager torch paths, which apply ``bmm2_scale`` correctly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "difftest" / "corpus"


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "ci" / script), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def fingerprint(repro: Path) -> dict[str, float]:
    done = run("scale_fingerprint.py", str(repro))
    assert done.returncode == 0, done.stderr
    fields = re.findall(r"(recorded max\|err\||no_bmm2|bmm1/bmm2)=([0-9.e+-]+)", done.stdout)
    return {name: float(value) for name, value in fields}


def test_fmha_v2_finding_is_an_ignored_bmm2_scale() -> None:
    numbers = fingerprint(CORPUS / "fmha-v2-bmm2-scale-ignored.repro.json")
    assert numbers["recorded max|err|"] > 1.0
    assert numbers["no_bmm2"] == numbers["recorded max|err|"]


def test_xqa_finding_is_bmm2_scale_moved_into_the_logits() -> None:
    numbers = fingerprint(CORPUS / "xqa-bmm2-scale-ignored.repro.json")
    assert numbers["recorded max|err|"] > 1.0
    assert numbers["bmm1/bmm2"] == numbers["recorded max|err|"]


def test_fingerprint_without_files_is_a_usage_error() -> None:
    done = run("scale_fingerprint.py")
    assert done.returncode == 2 and done.stderr.startswith("usage:")


def test_probe_sees_eager_paths_apply_bmm2_scale() -> None:
    repro = CORPUS / "fmha-v2-bmm2-scale-ignored.repro.json"
    done = run("h200_scale_probe.py", str(repro), "torch-sdpa", "torch-paged-online")
    assert done.returncode == 0, done.stderr
    rows = re.findall(
        r"^(\S+) +bmm2=(\S+) +max\|out-oracle\|=(\S+) +bitwise==out\(1\): (True|False) +"
        r"max\|out-s\*out\(1\)\|=(\S+)$",
        done.stdout,
        re.MULTILINE,
    )
    assert len(rows) == 2 * 5
    for path, scale, _, same, scaled in rows:
        # Scaling by a power of two is exact: the output is s * out(1), bit for bit.
        assert float(scaled) == 0.0, (path, scale)
        assert (same == "True") == (float(scale) == 1.0)


def test_probe_each_tallies_verdicts_with_unit_bmm2_scale() -> None:
    repro = str(CORPUS / "fmha-v2-bmm2-scale-ignored.repro.json")
    done = run("h200_scale_probe.py", "--each", "torch-sdpa", repro, repro)
    assert done.returncode == 0, done.stderr
    assert "tally: 2 repros: bitwise==out(bmm2=1) False, verdict with bmm2=1 AGREE" in done.stdout
