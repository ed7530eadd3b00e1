#!/usr/bin/env bash
# One GPU call that validates what needs the H200, in order of importance; everything to $OUT
# (at most 8 files come back). Usage on the GPU machine: bash ci/h200_validation.sh
set -u
log=$OUT/validation.log
source .gpu/env.sh >"$log" 2>&1
step() { echo "== $*" >>"$log"; }

step "paths"
python -m difftest paths >>"$log" 2>&1
python -m difftest paths --json >"$OUT/paths.json" 2>>"$log"

step "crash: XQA given a page id past the pool, contracts off, isolated"
DIFFTEST_NO_CONTRACTS=1 timeout 150 python -m difftest run --plugin tests/fixtures/gpu_bad_page.py \
  --paths xqa-bad-page,fi-decode-xqa --preset llama-3.1-8b --max-cases 3 --cases-per-variant 3 \
  --out /tmp/crash --json /tmp/crash.json >>"$log" 2>&1; echo "exit $?" >>"$log"
repro=$(ls /tmp/crash/findings/*crash*.json 2>/dev/null | head -1)
if [ -n "$repro" ]; then
  cp "$repro" "$OUT/crash-repro.json"
  step "replay, contracts off, under compute-sanitizer"
  DIFFTEST_NO_CONTRACTS=1 timeout 150 python -m difftest replay --sanitize "$repro" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  step "replay with the contracts on"
  timeout 60 python -m difftest replay "$repro" >>"$log" 2>&1; echo "exit $?" >>"$log"
fi

step "gate, ci profile, decode kernel vs FlashInfer prefill"
timeout 200 python ci/gate --profile ci --paths fi-decode-xqa,fi-prefill-fa2,torch-sdpa \
  --preset llama-3.1-8b,gpt-oss-120b --max-cases 24 --out /tmp/gate --summary "$OUT/gate.md" \
  --junit /tmp/gate/junit.xml --json /tmp/gate.json >>"$log" 2>&1; echo "exit $?" >>"$log"

step "presets: bench per preset, both modes"
for p in llama-3.1-8b qwen3.5-397b-a17b gpt-oss-120b llama-3.3-70b qwen3-next-80b; do
  step "bench $p"
  timeout 150 python -m difftest bench --preset "$p" --paths fi-decode-xqa,fi-prefill-fa2,torch-sdpa \
    --cases-per-variant 16 --max-cases 16 --budget-s 120 --json "/tmp/bench-$p.json" \
    --out "/tmp/o-$p" >>"$log" 2>&1; echo "exit $?" >>"$log"
done
python - <<'PY' >>"$log" 2>&1
import glob, json, os
out = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob("/tmp/bench-*.json"))}
for name in ("crash", "gate"):
    if os.path.exists(f"/tmp/{name}.json"):
        out[name] = json.load(open(f"/tmp/{name}.json"))
json.dump(out, open(os.environ["OUT"] + "/results.json", "w"), indent=1)
print("merged", list(out))
PY
tar czf "$OUT/findings.tgz" /tmp/o-*/findings /tmp/gate /tmp/crash 2>/dev/null
tail -c 11000 "$log"
