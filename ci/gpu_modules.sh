#!/usr/bin/env bash
# Compiled FlashInfer modules kept between machines. FMHAv2 and fa3 modules take minutes each to
# compile; `save` packs the libraries of FlashInfer's JIT cache into one archive, and `restore`
# installs such archives as FlashInfer AOT artifacts (the library loads a module from its AOT
# directory, FLASHINFER_AOT_DIR, before it would compile one). Plain: it uses the python3 on PATH
# (PYTHON overrides) and whatever FlashInfer that imports.
#   bash ci/gpu_modules.sh save NAME      # pack the JIT cache's libraries into the output folder:
#                                         # DIFFTEST_GPU_OUT, or difftest-out/gpu in the checkout
#   bash ci/gpu_modules.sh restore [DIR]  # install the archives in DIR (default .gpu-modules)
# GPU_MODULES_ONLY=ERE: `save` packs only the modules whose names match (grep -E), e.g.
# 'trtllm_fmha_v2|_sm90$' for the FMHAv2 and fa3 builds that take minutes.
# GPU_MODULES_PART_MB=N: `save` writes an archive larger than N MiB as pieces of N MiB
# (NAME.tar.xz.part00, ...; join them with cat). An archive holds <module>/<module>.so; its name
# starts with the flashinfer version and arch it was built for (flashinfer-0.6.16.post4-90a-...),
# and restore installs only archives that match this machine.
# ci/device_runner.sh runs `restore .gpu-modules` before each device call and sets the output
# folder to $OUT with 15 MiB pieces; keep what comes back in the ignored .gpu-modules/.
set -u
verb=${1:?usage: gpu_modules.sh restore [DIR] | save NAME}
# One import of flashinfer: the tag archives are named by, its AOT and its JIT directory.
{ read -r tag; read -r aot; read -r ops; } < <("${PYTHON:-python3}" - 2>/dev/null <<'PY'
import flashinfer
from flashinfer.jit import env
print(f"flashinfer-{flashinfer.__version__}-{env.FLASHINFER_WORKSPACE_DIR.name}")
print(env.FLASHINFER_AOT_DIR)
print(env.FLASHINFER_JIT_DIR)
PY
) && [ -n "${ops:-}" ] || { echo "gpu_modules: flashinfer is not importable"; exit 1; }
case $verb in
restore)
  dir=${2:-.gpu-modules}
  mkdir -p "$aot"
  shopt -s nullglob
  for archive in "$dir"/*.tar.xz; do
    name=$(basename "$archive")
    if [[ $name != "$tag"-* ]]; then
      echo "gpu_modules: skipped $name (built for another version or arch; this is $tag)"
      continue
    fi
    listed=$(xz -dc "$archive" | tar xvf - -C "$aot") || exit 1
    echo "gpu_modules: installed $name: $(grep -c '\.so$' <<<"$listed") modules"
  done
  ;;
save)
  name=${2:?usage: gpu_modules.sh save NAME}
  out=${DIFFTEST_GPU_OUT:-$(dirname "$0")/../difftest-out/gpu}
  mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
  cd "$ops" || exit 1
  shopt -s nullglob
  libs=(*/*.so)
  if [ -n "${GPU_MODULES_ONLY:-}" ]; then
    mapfile -t libs < <(printf '%s\n' "${libs[@]}" | while read -r lib; do
      grep -qE -- "$GPU_MODULES_ONLY" <<<"${lib%%/*}" && echo "$lib"
    done)
  fi
  [ ${#libs[@]} -gt 0 ] || { echo "gpu_modules: no compiled modules in $ops${GPU_MODULES_ONLY:+ matching $GPU_MODULES_ONLY}"; exit 1; }
  archive=$out/$tag-$name.tar.xz
  tar cf - "${libs[@]}" | xz -T0 -6 >"$archive" || exit 1
  part=${GPU_MODULES_PART_MB:-0}
  if [ "$part" -gt 0 ] && [ "$(stat -c %s "$archive")" -gt $((part << 20)) ]; then
    split -b "${part}M" -d "$archive" "$archive.part" && rm "$archive" || exit 1
    echo "gpu_modules: saved ${#libs[@]} modules as $archive.part* (join with cat)"
  else
    echo "gpu_modules: saved ${#libs[@]} modules as $archive"
  fi
  ;;
*) echo "usage: gpu_modules.sh restore [DIR] | save NAME"; exit 2 ;;
esac
