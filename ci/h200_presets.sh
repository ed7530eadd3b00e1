#!/usr/bin/env bash
# One GPU call: list the paths, then a short bench (warmup + campaign) per model preset with the
# decode kernel (XQA) and FlashInfer's prefill (fa2) against the oracle. Logs and JSON to $OUT.
# Usage on the GPU machine: bash ci/h200_presets.sh [PATHS] [CASES]
set -u
paths=${1:-fi-decode-xqa,fi-prefill-fa2,torch-sdpa}
cases=${2:-16}
log=$OUT/presets.log
source .gpu/env.sh >"$log" 2>&1
python -m difftest paths --json >"$OUT/paths.json" 2>>"$log"
for p in llama-3.1-8b qwen3.5-397b-a17b gpt-oss-120b llama-3.3-70b qwen3-next-80b; do
  echo "== $p" >>"$log"
  timeout 150 python -m difftest bench --preset "$p" --paths "$paths" --cases-per-variant "$cases" \
    --max-cases "$cases" --budget-s 120 --json "$OUT/bench-$p.json" --out "/tmp/o-$p" >>"$log" 2>&1
  echo "exit $?" >>"$log"
done
tar czf "$OUT/findings.tgz" /tmp/o-*/findings 2>/dev/null
cat "$log"
