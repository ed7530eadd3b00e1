#!/usr/bin/env bash
# Issue 17 on the GPU: one FlashInfer release (or both) as installed side by side.
#
#   bash ci/h200_versions.sh VERSION [STEPS]
#
# VERSION: a release whose site is in $DIFFTEST_SITES/VERSION (0.6.16.post4, 0.7.4), or "both"
# (then the steps run for every version of BISECT_VERSIONS, and bisect once across them).
# STEPS, comma-separated (default paths,gpu,run; GPU_TESTS picks the tests of gpu):
#   paths   difftest paths (table and JSON): what is available, the pins, the detected API
#   gpu     tests/gpu (pytest -n 8 --dist loadgroup), results as JSON lines
#   run     a short difftest run over every available path: `difftest warmup` builds the
#           modules of its first RUN_VARIANTS (default 1) compile variants side by side (at most
#           RUN_WARM_S, default 300; 0 skips it), then the run (RUN_BUDGET_S, default 120 s)
#   warm    difftest warmup --repro CORPUS --processes for every version of BISECT_VERSIONS at
#           once, each into its own JIT cache (WARM_JOBS builds each, default 6; WARM_TIMEOUT_S):
#           the replays of bisect then load modules instead of compiling one after another
#   bisect  difftest bisect over the whole corpus across BISECT_VERSIONS (default
#           0.6.16.post4,0.7.4), two versions at a time, --update-corpus; the updated entries
#           come back as corpus-updated.tgz (unpack it in difftest/ of the checkout;
#           DIFFTEST_CORPUS replaces the corpus folder)
# Sites: with .gpu-versions/ in the checkout (bash ci/stage_versions.sh, then carry
# [".gpu-versions"]), each release is installed into its own site $DIFFTEST_SITES/V
# (default ~/.difftest-sites) with apache-tvm-ffi; without it, the sites must already be there.
# Each version has its own JIT cache, $DIFFTEST_JIT_ROOT/V (default ~/.difftest-jit/V), shared by
# its steps and by bisect, so bisect reuses what tests/gpu and the run built for that version.
# Output (at most 8 files) to DIFFTEST_GPU_OUT, else $OUT, else difftest-out/gpu:
#   versions-VERSION.log, paths-V.json, gpu-V.jsonl, run-V.json, findings-V.tgz, bisect.json,
#   corpus-updated.tgz
# Cold JIT builds dominate the time (H200, 0.6.x): XQA 10-48 s, fa2 20-120 s, the decode wrapper
# 60-120 s, fa3 100-240 s, FMHAv2 170-365 s per module.
# TOTAL_S (default 570): the whole script ends within this many seconds of its start, so that
# everything comes back before the device tool's 600 s limit: each step gets at most what is
# left (less 20 s for packing up); a step with under 30 s left is skipped, saying so. The run's
# budget and bisect's --timeout-s shrink to fit, so they stop on their own and write their JSON
# (bisect: repros it had not judged by then are "unfinished", and nothing is recorded for them).
set -u
total_s=${TOTAL_S:-570} pack_up_s=20
deadline=$(($(date +%s) + total_s))
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
version=$1
steps=,${2:-paths,gpu,run},
root=$(cd "$(dirname "$0")/.." && pwd)
bisect_versions=${BISECT_VERSIONS:-0.6.16.post4,0.7.4}
if [ "$version" = both ]; then versions=${bisect_versions//,/ }; else versions=$version; fi

# One site per release staged in .gpu-versions/ (a wheel or a kit's site tree, with tvm-ffi).
# shellcheck source=ci/release_sites.sh
source "$root/ci/release_sites.sh"
site_log=$(mktemp)
if [ -d "$stage" ]; then
  for v in $(echo "$versions ${bisect_versions//,/ }" | tr ' ' '\n' | sort -u); do
    install_site "$v" "$site_log"
  done
fi

first=${versions%% *}
use_site "$first"
name=versions-$version
# shellcheck source=ci/h200_setup.sh
source "$root/ci/h200_setup.sh"
py=${PYTHON:-python3}
cat "$site_log" >>"$log" && rm -f "$site_log"

for v in $versions; do
  use_site "$v"
  "$py" -c "import flashinfer; print('flashinfer', flashinfer.__version__, 'from', flashinfer.__file__)" >>"$log" 2>&1
  if [[ $steps == *,paths,* ]]; then
    step "$v: difftest paths"
    "$py" -m difftest paths >>"$log" 2>&1
    "$py" -m difftest paths --json >"$out/paths-$v.json" 2>>"$log"
  fi
  if [[ $steps == *,gpu,* ]]; then
    step "$v: tests/gpu"
    t=$(left "${GPU_TIMEOUT_S:-390}")
    if enough "$t"; then
      mkdir -p "$work/gpu-$v"
      MAX_JOBS=${GPU_MAX_JOBS:-4} DIFFTEST_GPU_OUT=$work/gpu-$v timeout -k 10 "$t" \
        "$py" -m pytest -p no:cacheprovider -n 8 --dist loadgroup ${GPU_TESTS:-tests/gpu} -q --durations=15 \
        >>"$log" 2>&1
      echo "exit $? (limit $t s)" >>"$log"
      cp "$work/gpu-$v/gpu_results.jsonl" "$out/gpu-$v.jsonl" 2>>"$log"
    fi
  fi
  if [[ $steps == *,run,* ]]; then
    step "$v: difftest run over every available path"
    [ -f "$out/paths-$v.json" ] || "$py" -m difftest paths --json >"$out/paths-$v.json" 2>>"$log"
    avail=$("$py" -c "import json, sys; print(','.join(r['name'] for r in json.load(open(sys.argv[1])) if r['available']))" "$out/paths-$v.json")
    echo "paths: $avail" >>"$log"
    # The modules of the run's first RUN_VARIANTS compile variants, built side by side first
    # (a run builds them one at a time, inside its cases), as ci/h200_campaign.sh does.
    variants=${RUN_VARIANTS:-1}
    t=$(left "${RUN_WARM_S:-300}")
    if [ "${RUN_WARM_S:-300}" -gt 0 ] && enough "$t"; then
      step "$v: warmup for the run ($variants variants)"
      MAX_JOBS=${WARM_MAX_JOBS:-4} timeout -k 10 "$t" "$py" -m difftest warmup --paths "$avail" \
        --variants $((variants * 3)) --cases-per-variant 16 --horizon $((variants * 16)) \
        --processes --jobs "${WARM_JOBS:-8}" >>"$log" 2>&1
      echo "exit $? (limit $t s)" >>"$log"
    fi
    t=$(left "${RUN_TIMEOUT_S:-240}")
    if enough "$t"; then
      step "$v: the run"
      budget=$(left "${RUN_BUDGET_S:-120}")
      [ "$budget" -gt $((t - 30)) ] && budget=$((t - 30))
      [ "$budget" -lt 10 ] && budget=10
      MAX_JOBS=${RUN_MAX_JOBS:-16} timeout -k 15 "$t" "$py" -m difftest run \
        --paths "$avail" --budget-s "$budget" --variants "$variants" --cases-per-variant 16 \
        --out "$work/run-$v" --json "$out/run-$v.json" >>"$log" 2>&1
      echo "exit $? (budget $budget s, limit $t s)" >>"$log"
      (cd "$work/run-$v" 2>/dev/null && tar czf "$out/findings-$v.tgz" findings groups 2>/dev/null)
    fi
  fi
done

if [[ $steps == *,warm,* ]] && enough "$(left "${WARM_TIMEOUT_S:-400}")"; then
  step "warm up the corpus's modules for $bisect_versions"
  t=$(left "${WARM_TIMEOUT_S:-400}")
  for v in ${bisect_versions//,/ }; do
    (
      use_site "$v"
      MAX_JOBS=${WARM_MAX_JOBS:-4} timeout "$t" "$py" -m difftest warmup \
        --repro "$corpus" --processes \
        --jobs "${WARM_JOBS:-6}" >"$work/warm-$v.log" 2>&1
      echo "exit $?" >>"$work/warm-$v.log"
    ) &
  done
  wait
  for v in ${bisect_versions//,/ }; do echo "-- warmup $v" >>"$log"; cat "$work/warm-$v.log" >>"$log"; done
fi

if [[ $steps == *,bisect,* ]]; then
  step "bisect the corpus across $bisect_versions"
  t=$(left "${BISECT_TIMEOUT_S:-560}")
  if enough "$t"; then
    # Each version's interpreter stops 20 s before the outer limit, so bisect writes its table.
    MAX_JOBS=${BISECT_MAX_JOBS:-8} timeout -k 10 "$t" "$py" -m difftest bisect \
      "$corpus" --versions "$bisect_versions" --kits "$sites" --jit-cache "$jit" \
      --work "$work/bisect" --jobs 2 --timeout-s $((t - 20)) --update-corpus \
      --json "$out/bisect.json" >>"$log" 2>&1
    echo "exit $? (limit $t s)" >>"$log"
    (cd "$corpus/.." && tar czf "$out/corpus-updated.tgz" --exclude='*.repro.json' "$(basename "$corpus")")
  fi
fi
step "done"
tail -c 11000 "$log"
