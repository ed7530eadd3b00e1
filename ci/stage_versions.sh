#!/usr/bin/env bash
# Stages every FlashInfer release of the workplace's GPU kits for ci/h200_versions.sh, side by
# side: apache-tvm-ffi, the 0.6.16.post4 wheel and the 0.7.4 kit, copied from ../shared/gpu into
# the checkout's ignored .gpu-versions/ (about 40 MB: under the device tool's 64 MiB carry, so
# one device call holds both releases and `difftest bisect` runs across them).
# Usage, in the checkout: bash ci/stage_versions.sh [SHARED_GPU_DIR]   (default ../shared/gpu)
# then carry [".gpu-versions"] and run: bash ci/h200_versions.sh VERSION [STEPS]
set -euo pipefail
root=$(git rev-parse --show-toplevel)
kit=${1:-$root/../shared/gpu}
[ -d "$kit/wheels" ] && [ -d "$kit/kits" ] || { echo "no GPU kits at $kit (wheels/, kits/)" >&2; exit 2; }
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-versions/' "$exclude" 2>/dev/null || echo '/.gpu-versions/' >>"$exclude"
rm -rf "$root/.gpu-versions" && mkdir -p "$root/.gpu-versions"
cp "$kit"/wheels/apache_tvm_ffi-*.whl "$kit"/wheels/flashinfer_python-*.whl "$root/.gpu-versions/"
cp "$kit"/kits/flashinfer-*.tar.xz "$root/.gpu-versions/"
size=$(du -sm "$root/.gpu-versions" | cut -f1)
echo "staged into $root/.gpu-versions (${size} MB):"
ls "$root/.gpu-versions"
[ "$size" -lt 64 ] || { echo "over the 64 MiB carry limit" >&2; exit 1; }
