# Sourced by ci/h200_versions.sh, ci/h200_modes.sh and ci/h200_release.sh: what they share.
# Needs, set by the caller: root  the checkout.
# Sets: stage  the staged releases (DIFFTEST_STAGE, default .gpu-versions: bash
#   ci/stage_versions.sh puts apache-tvm-ffi, wheels and kits' site trees there); sites  where
#   each release's site goes (DIFFTEST_SITES, default ~/.difftest-sites); jit  where its JIT
#   cache goes (DIFFTEST_JIT_ROOT, default ~/.difftest-jit); corpus  (DIFFTEST_CORPUS, default
#   the shipped one); base_path  the checkout and the caller's PYTHONPATH; DIFFTEST_GPU_OUT from
#   $OUT on the device machine; the FlashInfer JIT settings (SM90, no cubin downloads).
# install_site VERSION LOG: a fresh $sites/VERSION from what $stage holds (tvm-ffi, then the
#   kit's site tree or the wheel); what it prints, and a failure, go to LOG.
# use_site VERSION: the release's site first on PYTHONPATH (before the checkout), its own JIT
#   cache as FLASHINFER_WORKSPACE_BASE.
# enter_release VERSION: install_site (when something is staged), its output kept in $site_log,
#   then use_site; call it before ci/h200_setup.sh and release_logged after it.
# release_logged: the install's output appended to $log, and .gpu-modules' archives for this
#   release restored (ci/gpu_modules.sh restore; it skips the other releases' archives).
# step TEXT: a timestamped step line in $log.
# left SECONDS / enough SECONDS, for a script bounded by TOTAL_S (it sets deadline, total_s and
#   pack_up_s): at most SECONDS and at most what is left before the deadline less pack_up_s;
#   enough fails, saying so in $log, when a step would get under 30 s.
stage=${DIFFTEST_STAGE:-$root/.gpu-versions}
sites=${DIFFTEST_SITES:-$HOME/.difftest-sites}
jit=${DIFFTEST_JIT_ROOT:-$HOME/.difftest-jit}
corpus=${DIFFTEST_CORPUS:-$root/difftest/corpus}
[ -n "${OUT:-}" ] && export DIFFTEST_GPU_OUT=${DIFFTEST_GPU_OUT:-$OUT}
export PYTHONUNBUFFERED=1
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_NO_DOWNLOAD=${FLASHINFER_NO_DOWNLOAD:-1}
base_path=$root${PYTHONPATH:+:$PYTHONPATH}

install_site() {
  local v=$1 log=$2
  rm -rf "${sites:?}/$v" && mkdir -p "$sites/$v"
  {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$sites/$v" "$stage"/apache_tvm_ffi-*.whl
    if [ -f "$stage/flashinfer-$v.tar.xz" ]; then
      xz -dc "$stage/flashinfer-$v.tar.xz" | tar x -C "$sites/$v"
    elif ls "$stage"/flashinfer_python-"$v"-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$sites/$v" "$stage"/flashinfer_python-"$v"-*.whl
    else
      echo "no flashinfer $v in $stage"
    fi
  } >>"$log" 2>&1 || echo "site $v: setup failed" >>"$log"
}

use_site() {
  export PYTHONPATH=$sites/$1:$base_path FLASHINFER_WORKSPACE_BASE=$jit/$1
  mkdir -p "$FLASHINFER_WORKSPACE_BASE"
}

enter_release() {
  site_log=$(mktemp)
  [ -d "$stage" ] && install_site "$1" "$site_log"
  use_site "$1"
}

release_logged() {
  cat "$site_log" >>"$log" && rm -f "$site_log"
  if [ -d "$root/.gpu-modules" ]; then
    PYTHON=$py bash "$root/ci/gpu_modules.sh" restore "$root/.gpu-modules" >>"$log" 2>&1
  fi
}

step() { echo "== $(date +%T) $*" >>"$log"; }

left() {
  local rest=$((deadline - $(date +%s) - pack_up_s))
  if [ "$rest" -lt "$1" ]; then echo "$rest"; else echo "$1"; fi
}

enough() {
  [ "$1" -ge 30 ] && return 0
  echo "skipped: ${1} s left of TOTAL_S=$total_s" >>"$log"
  return 1
}
