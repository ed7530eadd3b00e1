#!/usr/bin/env bash
# Build FlashInfer JIT modules on the H200 and send their libraries back (ci/gpu_modules.sh),
# so that later device calls, each on a bare machine, load them instead of compiling again.
#   PATHS=fi-context-fmha-v2 NAME=fmha-v2-bf16 bash ci/h200_build_modules.sh
# carry [".gpu", ".gpu-modules"] (modules already kept are installed first, not rebuilt).
# Knobs: PATHS, NAME, PRESETS, PER_VARIANT, JOBS (build processes), NINJA_JOBS (per build),
# WARM_S. A module that is still compiling when WARM_S ends is not sent back: give a build
# that runs alone all the cores (NINJA_JOBS=16).
set -u
log=$OUT/build.log
source ci/h200_setup.sh
export MAX_JOBS=${NINJA_JOBS:-16}
echo "== $(date +%T) build $PATHS in ${JOBS:-4} processes, $MAX_JOBS ninja jobs each" >>"$log"
timeout "${WARM_S:-400}" python -m difftest warmup --preset "$PRESETS" --paths "$PATHS" \
  --variants 3 --cases-per-variant "${PER_VARIANT:-8}" --horizon "${PER_VARIANT:-8}" \
  --processes --jobs "${JOBS:-4}" >>"$log" 2>&1
echo "exit $?" >>"$log"
bash ci/gpu_modules.sh save "${NAME:?NAME names the archive}" >>"$log" 2>&1
ls -la "$OUT" >>"$log"
cat "$log"
