#!/usr/bin/env bash
# Settle one corpus entry on the GPU, in one call: which releases it fails on, and how small it
# shrinks.
#
#   bash ci/h200_finding.sh ENTRY [STEPS]   (ENTRY: a corpus entry's name, e.g.
#                                            xqa-fp8-long-row-scale; STEPS: bisect,shrink)
#
# Run it directly on the device machine (not through ci/device_runner.sh), with the releases
# staged side by side: bash ci/stage_versions.sh here, then carry [".gpu-versions"].
# 1. bisect: `difftest bisect` replays the entry on every release of BISECT_VERSIONS (default
#    0.6.16.post4,0.7.4), each in its own site and JIT cache, and writes what it saw into a copy
#    of the entry (--update-corpus); the copy comes back as entry.tgz.
# 2. shrink: `difftest shrink` on the entry's repro under SHRINK_VERSION (default 0.7.4), with
#    SHRINK_S seconds (default 300) and SHRINK_RUNS runs (default 2000): it prints the trigger
#    the shrunk finding needs; then `difftest explain` of the shrunk repro (where its error is),
#    and a replay of the shrunk repro on every release. The shrunk folder: shrunk.tgz.
# PLUGIN: a module (or .py file) that registers the entry's path, when it is not built in.
# Output (DIFFTEST_GPU_OUT, else $OUT, else difftest-out/gpu): finding.log, bisect.json,
# replay-shrunk.json, entry.tgz, shrunk.tgz. TOTAL_S (default 570) bounds the whole script.
set -u
total_s=${TOTAL_S:-570} pack_up_s=20
deadline=$(($(date +%s) + total_s))
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
entry=$1
steps=,${2:-bisect,shrink},
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=ci/release_sites.sh
source "$root/ci/release_sites.sh"
versions=${BISECT_VERSIONS:-0.6.16.post4,0.7.4}
shrink_version=${SHRINK_VERSION:-0.7.4}
site_log=$(mktemp)
if [ -d "$stage" ]; then
  for v in ${versions//,/ }; do install_site "$v" "$site_log"; done
fi
use_site "$shrink_version"
name=finding
# shellcheck source=ci/h200_setup.sh
source "$root/ci/h200_setup.sh"
cat "$site_log" >>"$log" && rm -f "$site_log"
if [ ! -f "$corpus/$entry.json" ]; then
  echo "no corpus entry $corpus/$entry.json" | tee -a "$log" >&2
  exit 2
fi
plugin=()
[ -n "${PLUGIN:-}" ] && plugin=(--plugin "$PLUGIN")
mkdir -p "$work/corpus"
cp "$corpus/$entry.json" "$corpus/$entry.repro.json" "$work/corpus/"

if [[ $steps == *,bisect,* ]]; then
  step "bisect $entry across $versions"
  t=$(left "${BISECT_TIMEOUT_S:-200}")
fi
if [[ $steps == *,bisect,* ]] && enough "$t"; then
  MAX_JOBS=8 timeout -k 10 "$t" "$py" -m difftest bisect "${plugin[@]}" "$work/corpus/$entry.json" \
    --versions "$versions" --kits "$sites" --jit-cache "$jit" --work "$work/bisect" --jobs 2 \
    --timeout-s $((t - 20)) --update-corpus --json "$out/bisect.json" >>"$log" 2>&1
  echo "exit $? (limit $t s)" >>"$log"
  (cd "$work" && tar czf "$out/entry.tgz" corpus)
fi

if [[ $steps == *,shrink,* ]]; then
  step "shrink $entry on $shrink_version"
  t=$(left $((${SHRINK_S:-300} + 60)))
fi
if [[ $steps == *,shrink,* ]] && enough "$t"; then
  seconds=$((t - 45))
  [ "$seconds" -gt "${SHRINK_S:-300}" ] && seconds=${SHRINK_S:-300}
  timeout -k 10 "$t" "$py" -m difftest shrink "${plugin[@]}" "$work/corpus/$entry.repro.json" \
    --max-seconds "$seconds" --max-runs "${SHRINK_RUNS:-2000}" --out "$work/shrunk" >>"$log" 2>&1
  echo "exit $? (max seconds $seconds, limit $t s)" >>"$log"
  shrunk=$(ls "$work"/shrunk/*.json 2>/dev/null | grep -v explain.json | head -n 1)
  if [ -n "$shrunk" ]; then
    step "explain the shrunk repro"
    timeout -k 10 "$(left 120)" "$py" -m difftest explain "${plugin[@]}" "$shrunk" --json "$work/shrunk/explain.json" \
      >>"$log" 2>&1
    echo "exit $?" >>"$log"
    step "replay the shrunk repro on $versions"
    t=$(left 150)
    if enough "$t"; then
      timeout -k 10 "$t" "$py" -m difftest bisect "${plugin[@]}" "$shrunk" --versions "$versions" --kits "$sites" \
        --jit-cache "$jit" --work "$work/bisect-shrunk" --jobs 2 --timeout-s $((t - 20)) \
        --json "$out/replay-shrunk.json" >>"$log" 2>&1
      echo "exit $? (limit $t s)" >>"$log"
    fi
  fi
  (cd "$work" && tar czf "$out/shrunk.tgz" shrunk 2>/dev/null)
fi
step "done"
tail -c 11000 "$log"
