#!/usr/bin/env bash
# Issue 16's GPU figures in one call: difftest's throughput beside FlashInfer's own test.
#
#   bash ci/h200_speed.sh [STEPS]        (on the device machine: bash ci/device_runner.sh ...)
#
# STEPS, comma-separated (default small,fitest,presets,isolation), each under its own timeout:
#   small      difftest bench --limits small --paths fi-decode-xqa --pack 1 (FlashInfer's
#              test_xqa_batch_decode shape, one path + the oracle; 90 s budget)
#   fitest     FlashInfer's test_xqa_batch_decode on its first shape in bf16
#              (-k "4-4-64-4-2 and bf16-bf16-bf16": 48 cases), staged by
#              ci/stage_flashinfer_tests.sh into .flashinfer-tests/VERSION (carry it);
#              per-case durations from its JUnit XML: cold first case, warm median
#   presets    difftest bench, default GPU limits, --preset llama-3.1-8b and gpt-oss-120b,
#              paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2 (90 s each): the headline
#              kernel time / (wall - compile), cases/s per path, the phase shares
#   isolation  difftest run --max-cases 200 on fi-decode-xqa twice, --isolation process and
#              --isolation none, same seed (same cases): the wall-time ratio
# Output (at most 8 files) to DIFFTEST_GPU_OUT, else difftest-out/gpu: speed.log,
# bench-small.json, fitest.xml, bench-llama-3.1-8b.json, bench-gpt-oss-120b.json,
# run-process.json, run-none.json, speed.json (the figures, summarised).
# Expected time, cold: about 8-9 minutes (XQA JIT 10-48 s, FlashInfer's test JIT ~100 s, fa2
# 20-120 s, decode wrapper 60-120 s); FLASHINFER_TEST_VERSION picks the staged test (default
# the release under test, else 0.6.16.post4).
# SPEED_VERSION=V measures a release staged in .gpu-versions/ (bash ci/stage_versions.sh; carry
# [".gpu-versions", ".gpu-modules", ".flashinfer-tests"]) in its own site and JIT cache, as
# ci/h200_release.sh does, with .gpu-modules' archives for it restored first; then run this
# script directly, not through ci/device_runner.sh (which installs the .gpu kit instead).
set -u
steps=${1:-small,fitest,presets,isolation}
name=speed
if [ -n "${SPEED_VERSION:-}" ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  # shellcheck source=ci/release_sites.sh
  source "$root/ci/release_sites.sh"
  enter_release "$SPEED_VERSION"
  name=speed-$SPEED_VERSION
fi
source "$(dirname "$0")/h200_setup.sh"
[ -n "${SPEED_VERSION:-}" ] && release_logged
version=${FLASHINFER_TEST_VERSION:-${SPEED_VERSION:-0.6.16.post4}}
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
if has small; then
  echo "== $(date +%T) small" >>"$log"
  timeout 150 "$py" -m difftest bench --limits small --paths fi-decode-xqa --pack 1 \
    --budget-s 90 --json "$out/bench-small.json" --out "$work/o-small" >>"$log" 2>&1
  echo "exit $?" >>"$log"
fi
if has fitest; then
  echo "== $(date +%T) fitest (FlashInfer $version's test_xqa_batch_decode)" >>"$log"
  dir=$root/.flashinfer-tests/$version
  if [ ! -f "$dir/tests/attention/test_xqa_batch_decode.py" ]; then
    echo "not staged: $dir (bash ci/stage_flashinfer_tests.sh, then carry .flashinfer-tests)" >>"$log"
  else
    for w in "$dir"/einops-*.whl; do
      [ -f "$w" ] && "$py" -m pip install -q --no-deps --no-index "$w" >>"$log" 2>&1
    done
    (cd "$dir" && timeout 240 "$py" -m pytest -q -p no:cacheprovider \
      "tests/attention/test_xqa_batch_decode.py::test_xqa_batch_decode" \
      -k "4-4-64-4-2 and bf16-bf16-bf16" --junitxml "$out/fitest.xml" >>"$log" 2>&1)
    echo "exit $?" >>"$log"
  fi
fi
if has presets; then
  for p in llama-3.1-8b gpt-oss-120b; do
    echo "== $(date +%T) preset $p" >>"$log"
    timeout 150 "$py" -m difftest bench --preset "$p" \
      --paths fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2 --budget-s 90 \
      --json "$out/bench-$p.json" --out "$work/o-$p" >>"$log" 2>&1
    echo "exit $?" >>"$log"
  done
fi
if has isolation; then
  for iso in process none; do
    echo "== $(date +%T) isolation $iso" >>"$log"
    timeout 120 "$py" -m difftest run --paths fi-decode-xqa --max-cases 200 --seed 16 \
      --isolation "$iso" --no-shrink --budget-s 100 --json "$out/run-$iso.json" \
      --out "$work/o-$iso" >>"$log" 2>&1
    echo "exit $?" >>"$log"
  done
fi
"$py" - "$out" >>"$log" 2>&1 <<'PY'
import json, statistics, sys, xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
fig = {}
for f in sorted(out.glob("bench-*.json")):
    d = json.loads(f.read_text())
    fig[f.stem] = {k: d.get(k) for k in ("cases", "cases_per_s", "kernel_share", "wall_s")}
if (out / "fitest.xml").exists():
    times = [float(t.get("time", 0)) for t in ET.parse(out / "fitest.xml").iter("testcase")
             if not list(t.iter("skipped"))]
    if times:
        warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
        fig["fitest"] = {"cases": len(times), "first_s": times[0], "warm_median_s": warm,
                         "warm_cases_per_s": 1 / warm if warm else None}
        if "bench-small" in fig and fig["bench-small"]["cases_per_s"]:
            fig["small_vs_fitest_warm"] = fig["bench-small"]["cases_per_s"] * warm
runs = {i: out / f"run-{i}.json" for i in ("process", "none")}
if all(p.exists() for p in runs.values()):
    w = {i: json.loads(p.read_text()).get("wall_s") for i, p in runs.items()}
    c = {i: json.loads(p.read_text()).get("cases") for i, p in runs.items()}
    same = c["process"] == c["none"] and c["none"]  # a ratio only of the same cases, run
    fig["isolation"] = {"wall_s": w, "cases": c,
                        "ratio": w["process"] / w["none"] if same and w["none"] else None}
(out / "speed.json").write_text(json.dumps(fig, indent=1) + "\n")
print(json.dumps(fig, indent=1))
PY
cat "$log"
