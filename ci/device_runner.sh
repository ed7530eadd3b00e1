#!/usr/bin/env bash
# This project's device-runner conventions, in one place. Every other ci/ script is plain (it
# runs on any GPU machine with FlashInfer installed and writes to DIFFTEST_GPU_OUT, default
# difftest-out/gpu); this wrapper sets up the workplace's lent GPU machine, then runs one:
#   1. the GPU environment: sources .gpu/env.sh, the kit staged by ../shared/gpu/stage.sh, or,
#      without one, ci/device_env.sh, the committed copy of what it does (it installs what is
#      staged in .gpu/, sets FLASHINFER_CUDA_ARCH_LIST=9.0a, FLASHINFER_NO_DOWNLOAD=1, MAX_JOBS);
#   2. FlashInfer's JIT cache in the checkout's ignored .jit-cache/ (FLASHINFER_WORKSPACE_BASE);
#   3. the modules kept in .gpu-modules/, installed as FlashInfer AOT modules (ci/gpu_modules.sh
#      restore), so that a bare machine loads them instead of compiling;
#   4. output to $OUT, the folder the device tool sends back (at most 8 files of 16 MiB each):
#      DIFFTEST_GPU_OUT=$OUT, and module archives saved in 15 MiB pieces.
# Its own log is $OUT/device_runner.log (also printed). Then it runs the command: a .sh file
# with bash, a .py file with python3, anything else as given. From the checkout root:
#   bash ci/device_runner.sh ci/h200_campaign.sh all          # carry [".gpu", ".gpu-modules"]
#   bash ci/device_runner.sh ci/gpu_smoke.py --skip-expensive  # carry [".gpu"]
#   bash ci/device_runner.sh python3 -m pytest -n 8 tests/gpu -q
set -u
if [ $# -eq 0 ]; then
  echo "usage: bash ci/device_runner.sh SCRIPT|COMMAND [ARG...]" >&2
  exit 2
fi
if [ -z "${OUT:-}" ]; then
  echo "device_runner: \$OUT is not set: this wrapper is for the device machine; elsewhere run the script itself" >&2
  exit 2
fi
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
setup_log=$OUT/device_runner.log
export FLASHINFER_WORKSPACE_BASE=$PWD/.jit-cache
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
{
  if [ -f .gpu/env.sh ]; then
    echo "device_runner: sourcing .gpu/env.sh"
    # shellcheck disable=SC1091
    source .gpu/env.sh
  else
    echo "device_runner: no .gpu/env.sh; sourcing ci/device_env.sh"
    source ci/device_env.sh
  fi
} >"$setup_log" 2>&1
status=$?
if [ $status -ne 0 ]; then
  cat "$setup_log"
  echo "device_runner: the GPU environment failed to set up (status $status)"
  exit 1
fi
if [ -d .gpu-modules ]; then
  bash ci/gpu_modules.sh restore .gpu-modules >>"$setup_log" 2>&1
fi
export DIFFTEST_GPU_OUT=$OUT GPU_MODULES_PART_MB=15
echo "device_runner: output to $OUT; running: $*" >>"$setup_log"
cat "$setup_log"
case $1 in
*.sh) exec bash "$@" ;;
*.py) exec python3 "$@" ;;
*) exec "$@" ;;
esac
