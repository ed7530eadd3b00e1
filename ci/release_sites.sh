# Sourced by ci/h200_versions.sh and ci/h200_modes.sh: one site directory and one JIT cache per
# FlashInfer release, so that releases are installed side by side. Needs, set by the caller:
#   root   the checkout; stage  the staged releases (bash ci/stage_versions.sh: apache-tvm-ffi,
#   wheels, kits' site trees); sites  where the sites go; jit  where the JIT caches go.
# install_site VERSION LOG: a fresh $sites/VERSION from what $stage holds (tvm-ffi, then the
#   kit's site tree or the wheel); what it prints, and a failure, go to LOG.
# use_site VERSION: the release's site first on PYTHONPATH (before the checkout), its own JIT
#   cache as FLASHINFER_WORKSPACE_BASE.
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
