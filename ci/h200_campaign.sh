#!/usr/bin/env bash
# The per-preset campaign on the H200, carry [".gpu", ".gpu-modules"]: modules kept by
# ci/h200_build_modules.sh are installed first (ci/gpu_modules.sh), the rest compile here.
#   bash ci/h200_campaign.sh warm   # `difftest paths`, then build every module the run needs
#   bash ci/h200_campaign.sh run    # one `difftest run` per preset (FA2_CHECK=1: the fa2 check)
#   bash ci/h200_campaign.sh all    # warm, then the runs, in one call
# Knobs (environment): PRESETS, VARIANTS, PER_VARIANT, JOBS (build processes), NINJA_JOBS
# (per build), WARM_S, BUDGET_S, RUN_TIMEOUT_S and SHRINK_S (per preset; 0: --no-shrink),
# FA2_CHECK.
# Logs and JSON go to $OUT (at most 8 files come back).
set -u
phase=${1:?usage: h200_campaign.sh warm|run|all}
log=$OUT/$phase.log
source ci/h200_setup.sh
PATHS=fi-decode-xqa,fi-context-fmha-v2,fi-prefill-fa2,fi-prefill-fa3,fi-decode-wrapper,torch-sdpa
VARIANTS=${VARIANTS:-1}
PER_VARIANT=${PER_VARIANT:-8}
JOBS=${JOBS:-7}
export MAX_JOBS=${NINJA_JOBS:-$MAX_JOBS}
step() { echo "== $(date +%T) $*" >>"$log"; }
if [ "${SHRINK_S:-40}" = 0 ]; then shrink=(--no-shrink); else shrink=(--shrink-s "${SHRINK_S:-40}"); fi

if [ "$phase" = warm ] || [ "$phase" = all ]; then
  step "paths"
  python -m difftest paths >>"$log" 2>&1
  step "warmup: $VARIANTS templates x $PER_VARIANT variations per preset, in $JOBS processes"
  timeout "${WARM_S:-540}" python -m difftest warmup --preset "$PRESETS" --paths "$PATHS" \
    --variants $((VARIANTS * 3)) --cases-per-variant "$PER_VARIANT" \
    --horizon $((VARIANTS * PER_VARIANT)) --processes --jobs "$JOBS" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  du -sh "$FLASHINFER_WORKSPACE_BASE" >>"$log" 2>&1
  if [ "$phase" = warm ]; then tail -c 11000 "$log"; exit 0; fi
fi

if [ "${FA2_CHECK:-0}" = 1 ]; then
  step "fa2 workspace"
  timeout 150 python ci/h200_fa2_workspace.py "$OUT" >>"$log" 2>&1; echo "exit $?" >>"$log"
fi
for p in ${PRESETS//,/ }; do
  step "run $p"
  timeout "${RUN_TIMEOUT_S:-80}" python -m difftest run --preset "$p" --paths "$PATHS" \
    --variants "$VARIANTS" --cases-per-variant "$PER_VARIANT" --pack 8 \
    --budget-s "${BUDGET_S:-45}" "${shrink[@]}" --out "/tmp/run-$p" \
    --json "/tmp/run-$p.json" >>"$log" 2>&1
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
