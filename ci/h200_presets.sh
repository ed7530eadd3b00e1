#!/usr/bin/env bash
# List the paths, then a short bench (warmup + campaign) per model preset with the decode kernel
# (XQA) and FlashInfer's prefill (fa2) against the oracle. Plain: any GPU machine with FlashInfer
# installed (ci/h200_setup.sh: PYTHON, DIFFTEST_GPU_OUT, default difftest-out/gpu, PRESETS).
# Writes presets.log, paths.json, bench-PRESET.json and findings.tgz.
# Usage: bash ci/h200_presets.sh [PATHS] [CASES]
# On the project's device machine: bash ci/device_runner.sh ci/h200_presets.sh [PATHS] [CASES]
set -u
paths=${1:-fi-decode-xqa,fi-prefill-fa2,torch-sdpa}
cases=${2:-16}
name=presets
source "$(dirname "$0")/h200_setup.sh"
"$py" -m difftest paths --json >"$out/paths.json" 2>>"$log"
for p in ${PRESETS//,/ }; do
  echo "== $p" >>"$log"
  timeout 150 "$py" -m difftest bench --preset "$p" --paths "$paths" --cases-per-variant "$cases" \
    --max-cases "$cases" --budget-s 120 --json "$out/bench-$p.json" --out "$work/o-$p" >>"$log" 2>&1
  echo "exit $?" >>"$log"
done
(cd "$work" && tar czf "$out/findings.tgz" o-*/findings 2>/dev/null)
cat "$log"
