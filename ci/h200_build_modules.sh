#!/usr/bin/env bash
# Build FlashInfer JIT modules and pack their libraries (ci/gpu_modules.sh save), so that a
# later machine loads them instead of compiling again. Plain: any GPU machine with FlashInfer
# installed (ci/h200_setup.sh: PYTHON, DIFFTEST_GPU_OUT, default difftest-out/gpu).
#   PATHS=fi-context-fmha-v2 NAME=fmha-v2-bf16 bash ci/h200_build_modules.sh
# On the project's device machine: bash ci/device_runner.sh ci/h200_build_modules.sh, carry
# [".gpu", ".gpu-modules"] (modules already kept are installed first, not rebuilt).
# Knobs: PATHS, NAME, PRESETS, PER_VARIANT, JOBS (build processes), NINJA_JOBS (per build;
# default: the cores here), WARM_S. A module that is still compiling when WARM_S ends is not
# packed: give a build that runs alone all the cores.
set -u
: "${PATHS:?PATHS names the paths to build, e.g. PATHS=fi-context-fmha-v2}"
: "${NAME:?NAME names the archive}"
name=build
source "$(dirname "$0")/h200_setup.sh"
export MAX_JOBS=${NINJA_JOBS:-$(nproc)}
echo "== $(date +%T) build $PATHS in ${JOBS:-4} processes, $MAX_JOBS ninja jobs each" >>"$log"
timeout "${WARM_S:-400}" "$py" -m difftest warmup --preset "$PRESETS" --paths "$PATHS" \
  --variants 3 --cases-per-variant "${PER_VARIANT:-8}" --horizon "${PER_VARIANT:-8}" \
  --processes --jobs "${JOBS:-4}" >>"$log" 2>&1
echo "exit $?" >>"$log"
DIFFTEST_GPU_OUT=$out bash ci/gpu_modules.sh save "$NAME" >>"$log" 2>&1
saved=$?
rmdir "$work"
ls -la "$out" >>"$log"
cat "$log"
exit $saved
