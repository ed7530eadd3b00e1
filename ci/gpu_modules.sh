#!/usr/bin/env bash
# Compiled FlashInfer modules kept between device calls. Each call starts on a bare machine,
# and the FMHAv2 and fa3 modules take minutes each to compile; their libraries are sent back
# once and installed on later machines as FlashInfer AOT artifacts (the library loads a module
# from its AOT directory, FLASHINFER_AOT_DIR, before it would compile one).
#   bash ci/gpu_modules.sh restore     # on the device, after .gpu/env.sh: install .gpu-modules/
#   bash ci/gpu_modules.sh save NAME   # on the device: pack the JIT cache's libraries to $OUT
# Here: put what `save` sent back (NAME.tar.xz, or its .partNN pieces joined) into the ignored
# .gpu-modules/ and carry it: carry [".gpu", ".gpu-modules"]. An archive holds
# <module>/<module>.so; its name starts with the flashinfer version and arch it was built for
# (flashinfer-0.6.16.post4-90a-...), and restore installs only archives that match the machine.
set -u
verb=${1:?usage: gpu_modules.sh restore|save NAME}
# One import of flashinfer: the tag archives are named by, its AOT and its JIT directory.
{ read -r tag; read -r aot; read -r ops; } < <(python3 - 2>/dev/null <<'PY'
import flashinfer
from flashinfer.jit import env
print(f"flashinfer-{flashinfer.__version__}-{env.FLASHINFER_WORKSPACE_DIR.name}")
print(env.FLASHINFER_AOT_DIR)
print(env.FLASHINFER_JIT_DIR)
PY
) && [ -n "${ops:-}" ] || { echo "gpu_modules: flashinfer is not importable"; exit 1; }
case $verb in
restore)
  mkdir -p "$aot"
  shopt -s nullglob
  for archive in .gpu-modules/*.tar.xz; do
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
  cd "$ops" || exit 1
  shopt -s nullglob
  libs=(*/*.so)
  [ ${#libs[@]} -gt 0 ] || { echo "gpu_modules: no compiled modules in $ops"; exit 1; }
  tar cf - "${libs[@]}" | xz -T0 -6 >"/tmp/$tag-$name.tar.xz"
  # $OUT takes files of at most 16 MiB: larger archives come back in pieces (join with cat)
  if [ "$(stat -c %s "/tmp/$tag-$name.tar.xz")" -gt $((15 << 20)) ]; then
    split -b 15M -d "/tmp/$tag-$name.tar.xz" "$OUT/$tag-$name.tar.xz.part"
  else
    cp "/tmp/$tag-$name.tar.xz" "$OUT/"
  fi
  echo "gpu_modules: saved ${#libs[@]} modules as $tag-$name.tar.xz"
  ;;
*) echo "usage: gpu_modules.sh restore|save NAME"; exit 2 ;;
esac
