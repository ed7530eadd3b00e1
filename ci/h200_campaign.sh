#!/usr/bin/env bash
# The per-preset campaign on the H200, in two device calls made back to back (the machine stays
# warm for ~30 s, and the JIT cache lives in the ignored .jit-cache/ of the checkout):
#   bash ci/h200_campaign.sh warm   # compile every variant the run needs, 16 processes
#   bash ci/h200_campaign.sh run    # paths, fa2 workspace check, one `difftest run` per preset
#   bash ci/h200_campaign.sh all    # warm, then the runs, in one call (no paths or fa2 check)
# Knobs (environment): VARIANTS, PER_VARIANT, JOBS (build processes), NINJA_JOBS (per build),
# WARM_S, BUDGET_S and RUN_TIMEOUT_S (per preset).
# Logs and JSON go to $OUT (at most 8 files come back).
set -u
phase=${1:?usage: h200_campaign.sh warm|run|all}
export FLASHINFER_WORKSPACE_BASE=$PWD/.jit-cache
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
log=$OUT/$phase.log
source .gpu/env.sh >"$log" 2>&1
PRESETS=llama-3.1-8b,qwen3.5-397b-a17b,gpt-oss-120b,llama-3.3-70b,qwen3-next-80b
PATHS=fi-decode-xqa,fi-context-fmha-v2,fi-prefill-fa2,fi-prefill-fa3,fi-decode-wrapper,torch-sdpa
VARIANTS=${VARIANTS:-2}
PER_VARIANT=${PER_VARIANT:-16}
JOBS=${JOBS:-16}
export MAX_JOBS=${NINJA_JOBS:-$MAX_JOBS}
step() { echo "== $(date +%T) $*" >>"$log"; }

if [ "$phase" = warm ] || [ "$phase" = all ]; then
  step "warmup: $VARIANTS templates x $PER_VARIANT variations per preset, in 16 processes"
  timeout "${WARM_S:-540}" python -m difftest warmup --preset "$PRESETS" --paths "$PATHS" \
    --variants $((VARIANTS * 3)) --cases-per-variant "$PER_VARIANT" \
    --horizon $((VARIANTS * PER_VARIANT)) --processes --jobs "$JOBS" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  du -sh "$FLASHINFER_WORKSPACE_BASE" >>"$log" 2>&1
  if [ "$phase" = warm ]; then tail -c 11000 "$log"; exit 0; fi
fi

if [ "$phase" = run ]; then
  step "paths"
  python -m difftest paths >>"$log" 2>&1
  step "fa2 workspace"
  timeout 150 python ci/h200_fa2_workspace.py "$OUT" >>"$log" 2>&1; echo "exit $?" >>"$log"
fi
for p in ${PRESETS//,/ }; do
  step "run $p"
  timeout "${RUN_TIMEOUT_S:-150}" python -m difftest run --preset "$p" --paths "$PATHS" \
    --variants "$VARIANTS" --cases-per-variant "$PER_VARIANT" --pack 8 \
    --budget-s "${BUDGET_S:-60}" --out "/tmp/run-$p" --json "/tmp/run-$p.json" >>"$log" 2>&1
  echo "exit $?" >>"$log"
done
python - <<'PY' >>"$log" 2>&1
import glob, json, os
out = {os.path.basename(f)[4:-5]: json.load(open(f)) for f in sorted(glob.glob("/tmp/run-*.json"))}
json.dump(out, open(os.environ["OUT"] + "/runs.json", "w"), indent=1)
print("merged", list(out))
PY
tar czf "$OUT/findings.tgz" /tmp/run-*/findings 2>/dev/null
tail -c 11000 "$log"
