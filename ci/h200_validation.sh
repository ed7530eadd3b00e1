#!/usr/bin/env bash
# One run that validates what needs the GPU, in order of importance. Plain: any GPU machine with
# FlashInfer installed (ci/h200_setup.sh: PYTHON, DIFFTEST_GPU_OUT, default difftest-out/gpu).
# Writes validation.log, paths.json, crash-repro.json, gate.md, results.json and findings.tgz.
# Usage: bash ci/h200_validation.sh
# On the project's device machine: bash ci/device_runner.sh ci/h200_validation.sh, carry [".gpu"]
set -u
name=validation
source "$(dirname "$0")/h200_setup.sh"
step() { echo "== $*" >>"$log"; }

step "paths"
"$py" -m difftest paths >>"$log" 2>&1
"$py" -m difftest paths --json >"$out/paths.json" 2>>"$log"

step "crash: XQA given a page id past the pool, contracts off, isolated"
DIFFTEST_NO_CONTRACTS=1 timeout 150 "$py" -m difftest run --plugin tests/fixtures/gpu_bad_page.py \
  --paths xqa-bad-page,fi-decode-xqa --preset llama-3.1-8b --max-cases 3 --cases-per-variant 3 \
  --out "$work/crash" --json "$work/crash.json" >>"$log" 2>&1; echo "exit $?" >>"$log"
repro=$(ls "$work"/crash/findings/*crash*.json 2>/dev/null | head -1)
if [ -n "$repro" ]; then
  cp "$repro" "$out/crash-repro.json"
  step "replay, contracts off, under compute-sanitizer"
  DIFFTEST_NO_CONTRACTS=1 timeout 150 "$py" -m difftest replay --sanitize "$repro" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  step "replay with the contracts on"
  timeout 60 "$py" -m difftest replay "$repro" >>"$log" 2>&1; echo "exit $?" >>"$log"
fi

step "gate, ci profile, decode kernel vs FlashInfer prefill"
timeout 200 "$py" ci/gate --profile ci --paths fi-decode-xqa,fi-prefill-fa2,torch-sdpa \
  --preset llama-3.1-8b,gpt-oss-120b --max-cases 24 --out "$work/gate" --summary "$out/gate.md" \
  --junit "$work/gate/junit.xml" --json "$work/gate.json" >>"$log" 2>&1; echo "exit $?" >>"$log"

step "presets: bench per preset, both modes"
for p in ${PRESETS//,/ }; do
  step "bench $p"
  timeout 150 "$py" -m difftest bench --preset "$p" --paths fi-decode-xqa,fi-prefill-fa2,torch-sdpa \
    --cases-per-variant 16 --max-cases 16 --budget-s 120 --json "$work/bench-$p.json" \
    --out "$work/o-$p" >>"$log" 2>&1; echo "exit $?" >>"$log"
done
"$py" - "$work" "$out" <<'PY' >>"$log" 2>&1
import glob, json, os, sys
work, out = sys.argv[1:3]
res = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob(f"{work}/bench-*.json"))}
for name in ("crash", "gate"):
    if os.path.exists(f"{work}/{name}.json"):
        res[name] = json.load(open(f"{work}/{name}.json"))
json.dump(res, open(f"{out}/results.json", "w"), indent=1)
print("merged", list(res))
PY
(cd "$work" && tar czf "$out/findings.tgz" o-*/findings gate crash 2>/dev/null)
tail -c 11000 "$log"
