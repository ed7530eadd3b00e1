"""``ci/h200_finding.sh`` on a CPU, with the planted bug's corpus entry and two stand-in
``flashinfer`` releases in their own sites: the entry is bisected across both (and the copy of
it records both), its repro is shrunk with the trigger said, explained and replayed on both.
What the GPU adds is the kernels; the plumbing is checked here."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from _ci_scripts import release_env, run_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "h200_finding.sh"
ENTRY = "planted-page-stride"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_bisect_then_shrink_a_corpus_entry_across_two_releases(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in (f"{ENTRY}.json", f"{ENTRY}.repro.json"):
        shutil.copy(ROOT / "tests" / "corpus" / name, corpus / name)
    before = (corpus / f"{ENTRY}.json").read_text()
    out = tmp_path / "out"
    env = release_env(
        tmp_path,
        ("1.0", "1.1"),
        out,
        DIFFTEST_CORPUS=str(corpus),
        SHRINK_VERSION="1.1",
        SHRINK_S="60",
        PLUGIN=str(ROOT / "tests" / "fixtures" / "planted.py"),
    )
    proc = run_script(SCRIPT, ENTRY, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (out / "finding.log").read_text()

    report = json.loads((out / "bisect.json").read_text())
    assert [v["version"] for v in report["versions"]] == ["1.0", "1.1"]
    [row] = report["repros"]
    assert {v: c["state"] for v, c in row["cells"].items()} == {
        "1.0": "still fails",
        "1.1": "still fails",
    }
    assert (corpus / f"{ENTRY}.json").read_text() == before  # the copy is updated, not this
    with tarfile.open(out / "entry.tgz") as tar:
        member = tar.extractfile(f"corpus/{ENTRY}.json")
        assert member is not None
        updated = json.loads(member.read())
    assert updated["expect"]["flashinfer"] == {"1.0": "still_fails", "1.1": "still_fails"}

    [needs] = [x for x in log.splitlines() if x.startswith("  needs: ")]
    assert "(trigger: " in needs and "requests>1" in needs, needs
    with tarfile.open(out / "shrunk.tgz") as tar:
        names = sorted(Path(n).name for n in tar.getnames() if n.endswith(".json"))
    assert "explain.json" in names and len(names) == 2, names
    replayed = json.loads((out / "replay-shrunk.json").read_text())
    [row] = replayed["repros"]
    assert {c["state"] for c in row["cells"].values()} == {"still fails"}
