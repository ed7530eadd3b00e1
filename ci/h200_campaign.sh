#!/usr/bin/env bash
# The per-preset campaign over every FlashInfer path. Plain: any GPU machine with FlashInfer
# installed (ci/h200_setup.sh: PYTHON, DIFFTEST_GPU_OUT, default difftest-out/gpu); modules
# compile on first use, or come from FlashInfer's JIT cache.
#   bash ci/h200_campaign.sh warm   # `difftest paths`, then build every module the run needs
#   bash ci/h200_campaign.sh run    # one `difftest run` per preset (FA2_CHECK=1: the fa2 check)
#   bash ci/h200_campaign.sh all    # warm, then the runs, in one call
# On the project's device machine: bash ci/device_runner.sh ci/h200_campaign.sh all, carry
# [".gpu", ".gpu-modules"] (modules kept by ci/h200_build_modules.sh are installed first).
# Knobs (environment): PRESETS, VARIANTS, PER_VARIANT, JOBS (build processes), NINJA_JOBS
# (per build; default MAX_JOBS, else the cores here), WARM_S, BUDGET_S, RUN_TIMEOUT_S and
# SHRINK_S (per preset; 0: --no-shrink), FA2_CHECK.
# Writes PHASE.log, runs.json (every run's JSON) and findings.tgz (every run's findings/).
set -u
phase=${1:-}
case $phase in
warm | run | all) ;;
*) echo "usage: h200_campaign.sh warm|run|all"; exit 2 ;;
esac
name=$phase
source "$(dirname "$0")/h200_setup.sh"
PATHS=fi-decode-xqa,fi-context-fmha-v2,fi-prefill-fa2,fi-prefill-fa3,fi-decode-wrapper,torch-sdpa
VARIANTS=${VARIANTS:-1}
PER_VARIANT=${PER_VARIANT:-8}
JOBS=${JOBS:-7}
export MAX_JOBS=${NINJA_JOBS:-${MAX_JOBS:-$(nproc)}}
step() { echo "== $(date +%T) $*" >>"$log"; }
if [ "${SHRINK_S:-40}" = 0 ]; then shrink=(--no-shrink); else shrink=(--shrink-s "${SHRINK_S:-40}"); fi

if [ "$phase" = warm ] || [ "$phase" = all ]; then
  step "paths"
  "$py" -m difftest paths >>"$log" 2>&1
  step "warmup: $VARIANTS templates x $PER_VARIANT variations per preset, in $JOBS processes"
  timeout "${WARM_S:-540}" "$py" -m difftest warmup --preset "$PRESETS" --paths "$PATHS" \
    --variants $((VARIANTS * 3)) --cases-per-variant "$PER_VARIANT" \
    --horizon $((VARIANTS * PER_VARIANT)) --processes --jobs "$JOBS" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  du -sh "${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer" >>"$log" 2>&1
  if [ "$phase" = warm ]; then tail -c 11000 "$log"; exit 0; fi
fi

if [ "${FA2_CHECK:-0}" = 1 ]; then
  step "fa2 workspace"
  timeout 150 "$py" ci/h200_fa2_workspace.py "$out" >>"$log" 2>&1; echo "exit $?" >>"$log"
fi
for p in ${PRESETS//,/ }; do
  step "run $p"
  timeout "${RUN_TIMEOUT_S:-80}" "$py" -m difftest run --preset "$p" --paths "$PATHS" \
    --variants "$VARIANTS" --cases-per-variant "$PER_VARIANT" --pack 8 \
    --budget-s "${BUDGET_S:-45}" "${shrink[@]}" --out "$work/run-$p" \
    --json "$work/run-$p.json" >>"$log" 2>&1
  echo "exit $?" >>"$log"
done
"$py" - "$work" "$out" <<'PY' >>"$log" 2>&1
import glob, json, os, sys
work, out = sys.argv[1:3]
runs = {os.path.basename(f)[4:-5]: json.load(open(f)) for f in sorted(glob.glob(f"{work}/run-*.json"))}
json.dump(runs, open(f"{out}/runs.json", "w"), indent=1)
print("merged", list(runs))
PY
(cd "$work" && tar czf "$out/findings.tgz" run-*/findings 2>/dev/null)
tail -c 11000 "$log"
