#!/usr/bin/env bash
# Stages FlashInfer's own test_xqa_batch_decode (third-party code: never committed) for
# ci/h200_speed.sh, into the checkout's ignored .flashinfer-tests/VERSION/: the test file, the
# helpers it imports (tests/__init__.py, tests/conftest.py, tests/test_helpers/), read with
# `git show vVERSION:...` from a FlashInfer clone, and the einops wheel its sink reference needs
# (the GPU machine has no network: pip download it here first, into WHEEL_DIR).
# Usage, in the checkout:
#   bash ci/stage_flashinfer_tests.sh FLASHINFER_GIT_DIR [VERSION] [WHEEL_DIR]
#   (default VERSION 0.6.16.post4; WHEEL_DIR default: none, then einops must be installed there)
# then carry [".gpu", ".flashinfer-tests"] and run: bash ci/device_runner.sh ci/h200_speed.sh
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
src=$1
version=${2:-0.6.16.post4}
wheels=${3:-}
root=$(git rev-parse --show-toplevel)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.flashinfer-tests/' "$exclude" 2>/dev/null || echo '/.flashinfer-tests/' >>"$exclude"
dest=$root/.flashinfer-tests/$version
rm -rf "$dest" && mkdir -p "$dest/tests/attention" "$dest/tests/test_helpers"
files=(tests/__init__.py tests/conftest.py tests/attention/__init__.py
  tests/attention/test_xqa_batch_decode.py tests/test_helpers/__init__.py
  tests/test_helpers/sink_attention_reference.py)
for f in "${files[@]}"; do
  git --git-dir="$src" show "v$version:$f" >"$dest/$f" 2>/dev/null || : >"$dest/$f"
done
[ -s "$dest/tests/attention/test_xqa_batch_decode.py" ] ||
  { echo "no tests/attention/test_xqa_batch_decode.py at v$version in $src" >&2; exit 1; }
if [ -n "$wheels" ]; then
  cp "$wheels"/einops-*.whl "$dest/"
fi
echo "staged FlashInfer $version's test_xqa_batch_decode into $dest:"
ls -R "$dest" | head -20
