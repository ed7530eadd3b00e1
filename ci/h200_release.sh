#!/usr/bin/env bash
# One FlashInfer release checked in one device call: what issues 17 and 18 ask of each release,
# with the compiles of every step done side by side up front instead of one after another.
#
#   bash ci/h200_release.sh VERSION [STEPS]
#
# VERSION: a release staged in .gpu-versions/ (bash ci/stage_versions.sh; carry
# [".gpu-versions"]), installed into its own site and JIT cache as ci/h200_versions.sh does.
# STEPS, comma-separated, run in the order given (default paths,gpu,warm,bisect,run,graph,skip):
#   paths   difftest paths (table and JSON)
#   prebuild  the modules of one repro (PREBUILD, default the corpus's FMHAv2 entry) built
#           alone, in the foreground, with PREBUILD_MAX_JOBS nvcc jobs (default 16), before the
#           steps after it start (PREBUILD_S, default 360). FlashInfer builds a module once, in
#           whichever process asks first, with that process's MAX_JOBS; list prebuild first so
#           that FMHAv2 (6-7 minutes with 4-6 jobs beside other builds, Runs 10-11) gets every core
#   gpu     tests/gpu (GPU_TESTS, default all of it), started in the background at once and
#           waited for at the end (GPU_TIMEOUT_S, default 480); JSON lines, and one line per
#           test as it ends (-v), so a run cut by its limit still names what failed;
#           GPU_WAIT=1 waits for them before the next step (GPU_MAX_JOBS=16 GPU_WORKERS=1 then
#           builds each module of GPU_TESTS alone with every core, as prebuild does)
#   warm    difftest warmup for the corpus and for every campaign among STEPS, all at once, each
#           with the flags its campaign will use, so that each campaign's cases load modules
#           (WARM_S, default 300; the builds still running then are left to the campaigns);
#           WARM_FOR="graph skip" warms those campaigns only (default: all among STEPS);
#           WARM_MAX_JOBS (default 6) is each warmup's nvcc jobs, WARM_JOBS its build processes;
#           WARM_WAIT=0 lets the steps after it start at once (a case whose module is still
#           building waits on FlashInfer's build lock), and the warmups are waited for at the end
#   bisect  difftest bisect of the corpus on this release alone, --update-corpus
#   run     difftest run over every available path
#   graph   difftest run --graph over GRAPH_PATHS (fi-decode-xqa,fi-prefill-fa2,fi-decode-wrapper)
#   ragged  difftest run --ragged over RAGGED_PATHS (the paths whose API takes ragged queries)
#   skip    difftest run --skip-softmax over SKIP_PATHS (fi-decode-xqa,fi-context-fmha-v2)
#   save    at the end, wherever it is listed: the JIT cache's compiled modules as an archive
#           (ci/gpu_modules.sh save; SAVE_ONLY=ERE keeps the modules whose names match) in 15
#           MiB pieces; keep them in .gpu-modules/, whose archives for this release every
#           call restores first
# Each campaign: CAMPAIGN_BUDGET_S (default 60, shrinking included; RUN_BUDGET_S,
# GRAPH_BUDGET_S, RAGGED_BUDGET_S, SKIP_BUDGET_S set one campaign's), CAMPAIGN_VARIANTS compile
# variants (default 2; RUN_VARIANTS, GRAPH_VARIANTS, ... set one campaign's, for both its
# warmup and its run), 12 cases per variant, seed SEED (default 0); LIMITS=small|gpu sets
# --limits for all of them. TOTAL_S (default 560): every step gets at most what is left of it
# (less 25 s to pack up), and one with under 30 s left is skipped, saying so.
# Output (at most 8 files) to DIFFTEST_GPU_OUT, else $OUT: release-VERSION.log, paths.json,
# gpu.jsonl, bisect.json, campaigns.tgz (each campaign's report JSON, findings and groups),
# corpus-updated.tgz, and the module archive's pieces with save.
set -u
total_s=${TOTAL_S:-560} pack_up_s=25
deadline=$(($(date +%s) + total_s))
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
version=$1
steps=,${2:-paths,gpu,warm,bisect,run,graph,skip},
for s in ${steps//,/ }; do
  case $s in paths | prebuild | gpu | warm | bisect | run | graph | ragged | skip | save) ;; *)
    echo "h200_release: unknown step '$s'" >&2
    exit 2
    ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=ci/release_sites.sh
source "$root/ci/release_sites.sh"
enter_release "$version"
name=release-$version
# shellcheck source=ci/h200_setup.sh
source "$root/ci/h200_setup.sh"
"$py" -c "import flashinfer; print('flashinfer', flashinfer.__version__, 'from', flashinfer.__file__)" >>"$log" 2>&1
release_logged

"$py" -m difftest paths --json >"$out/paths.json" 2>>"$log"
avail=$("$py" -c "import json, sys; print(','.join(r['name'] for r in json.load(open(sys.argv[1])) if r['available']))" "$out/paths.json")
if [[ $steps == *,paths,* ]]; then
  step "difftest paths"
  "$py" -m difftest paths >>"$log" 2>&1
fi
echo "available: $avail" >>"$log"

# The campaigns: one definition each, used by their warmup and by their run.
common=(--seed "${SEED:-0}" --cases-per-variant 12)
[ -n "${LIMITS:-}" ] && common+=(--limits "$LIMITS")
variants_of() { # variants_of CAMPAIGN: its compile variants (RUN_VARIANTS, ..., CAMPAIGN_VARIANTS)
  local knob=${1^^}_VARIANTS
  echo "${!knob:-${CAMPAIGN_VARIANTS:-2}}"
}
declare -A campaign_paths=(
  [run]=$avail
  [graph]=${GRAPH_PATHS:-fi-decode-xqa,fi-prefill-fa2,fi-decode-wrapper}
  [ragged]=${RAGGED_PATHS:-fi-xqa-ragged,fi-prefill-fa2,fi-prefill-fa3,fi-context-fmha-v2,fi-decode-trtllm-gen,fi-context-trtllm-gen}
  [skip]=${SKIP_PATHS:-fi-decode-xqa,fi-context-fmha-v2}
)
declare -A campaign_flag=([run]="" [graph]=--graph [ragged]=--ragged [skip]=--skip-softmax)
campaigns=()
for c in run graph ragged skip; do [[ $steps == *,$c,* ]] && campaigns+=("$c"); done
only_available() { # the paths of $1 that are available here (the others say why in the run)
  local keep=() p
  for p in ${1//,/ }; do [[ ,$avail, == *,$p,* ]] && keep+=("$p"); done
  (IFS=,; echo "${keep[*]}")
}

gpu_pid=
warm_pids=()
warmups=()
gpu_tests() { # tests/gpu in the background, waited for at the end
  local t
  t=$(left "${GPU_TIMEOUT_S:-480}")
  enough "$t" || return
  step "tests/gpu in the background (limit $t s): ${GPU_TESTS:-tests/gpu}"
  mkdir -p "$work/gpu"
  # shellcheck disable=SC2086  # GPU_TESTS: several test files or node ids
  (MAX_JOBS=${GPU_MAX_JOBS:-4} DIFFTEST_GPU_OUT=$work/gpu timeout -k 10 "$t" \
    "$py" -m pytest -p no:cacheprovider -n "${GPU_WORKERS:-6}" --dist loadgroup \
    ${GPU_TESTS:-tests/gpu} -v -rs --durations=15 >"$work/gpu.log" 2>&1
    echo "exit $? (limit $t s)" >>"$work/gpu.log") &
  gpu_pid=$!
  [ "${GPU_WAIT:-0}" = 1 ] && gpu_done
}
gpu_done() { # wait for tests/gpu (once) and keep its log and results
  [ -n "$gpu_pid" ] || return
  step "waiting for tests/gpu"
  wait "$gpu_pid"
  gpu_pid=
  cat "$work/gpu.log" >>"$log"
  cp "$work/gpu/gpu_results.jsonl" "$out/gpu.jsonl" 2>>"$log"
}
warm_up() { # the corpus's and the campaigns' modules, side by side
  local t c paths v
  t=$(left "${WARM_S:-300}")
  enough "$t" || return
  step "warmup, side by side: the corpus and the campaigns ${campaigns[*]} (limit $t s)"
  (MAX_JOBS=${WARM_MAX_JOBS:-6} timeout -k 10 "$t" "$py" -m difftest warmup --repro "$corpus" \
    --processes --jobs "${WARM_JOBS:-3}" >"$work/warm-corpus.log" 2>&1
    echo "exit $?" >>"$work/warm-corpus.log") &
  warm_pids+=($!) && warmups+=(corpus)
  for c in ${WARM_FOR:-${campaigns[*]}}; do
    paths=$(only_available "${campaign_paths[$c]}")
    [ -n "$paths" ] || continue
    # shellcheck disable=SC2086  # the flag is empty for the plain run
    v=$(variants_of "$c")
    (MAX_JOBS=${WARM_MAX_JOBS:-6} timeout -k 10 "$t" "$py" -m difftest warmup "${common[@]}" \
      --variants "$v" ${campaign_flag[$c]} --paths "$paths" --horizon $((v * 12)) --processes \
      --jobs "${WARM_JOBS:-3}" >"$work/warm-$c.log" 2>&1
      echo "exit $?" >>"$work/warm-$c.log") &
    warm_pids+=($!) && warmups+=("$c")
  done
  [ "${WARM_WAIT:-1}" = 1 ] && warm_done
}
warm_done() { # wait for the warmups (once) and log what they built
  [ ${#warm_pids[@]} -gt 0 ] || return
  wait "${warm_pids[@]}"
  warm_pids=()
  local w
  for w in "${warmups[@]}"; do echo "-- warmup $w" >>"$log"; cat "$work/warm-$w.log" >>"$log"; done
}
prebuild() { # one repro's modules, alone and with every core, before anything else asks
  local t repro=${PREBUILD:-$corpus/fmha-v2-bmm2-scale-ignored.repro.json}
  t=$(left "${PREBUILD_S:-360}")
  enough "$t" || return
  [ -f "$repro" ] || { echo "prebuild: no repro $repro" >>"$log"; return; }
  step "prebuild, alone with ${PREBUILD_MAX_JOBS:-16} jobs: $(basename "$repro") (limit $t s)"
  MAX_JOBS=${PREBUILD_MAX_JOBS:-16} timeout -k 10 "$t" "$py" -m difftest warmup --repro "$repro" \
    --processes --jobs 1 >>"$log" 2>&1
  echo "exit $? (prebuild)" >>"$log"
}
bisect() { # the whole corpus on this release alone
  local t
  t=$(left "${BISECT_TIMEOUT_S:-150}")
  enough "$t" || return
  step "bisect the corpus on $version (limit $t s)"
  MAX_JOBS=${BISECT_MAX_JOBS:-8} timeout -k 10 "$t" "$py" -m difftest bisect "$corpus" \
    --versions "$version" --kits "$sites" --jit-cache "$jit" --work "$work/bisect" \
    --timeout-s $((t - 20)) --update-corpus --json "$out/bisect.json" >>"$log" 2>&1
  echo "exit $? (limit $t s)" >>"$log"
  (cd "$corpus/.." && tar czf "$out/corpus-updated.tgz" --exclude='*.repro.json' "$(basename "$corpus")")
}
campaign() { # campaign NAME: one bounded difftest run into $work/campaigns/NAME
  local c=$1 t budget knob=${1^^}_BUDGET_S
  local want=${!knob:-${CAMPAIGN_BUDGET_S:-60}}
  t=$(left $((want + 40)))
  enough "$t" || return
  budget=$((t - 40 < want ? t - 40 : want))
  [ "$budget" -lt 15 ] && budget=15
  step "$c: difftest run ${campaign_flag[$c]} over ${campaign_paths[$c]} (budget $budget s)"
  # shellcheck disable=SC2086
  MAX_JOBS=${RUN_MAX_JOBS:-16} timeout -k 10 "$t" "$py" -m difftest run "${common[@]}" \
    --variants "$(variants_of "$c")" ${campaign_flag[$c]} --paths "${campaign_paths[$c]}" --budget-s "$budget" \
    --out "$work/campaigns/$c" --json "$work/campaigns/$c.json" >>"$log" 2>&1
  echo "exit $? ($c)" >>"$log"
  (cd "$work/campaigns" && tar czf "$out/campaigns.tgz" . 2>/dev/null)
}

mkdir -p "$work/campaigns"
for s in ${steps//,/ }; do
  case $s in
  paths | save) ;;
  prebuild) prebuild ;;
  gpu) gpu_tests ;;
  warm) warm_up ;;
  bisect) bisect ;;
  *) campaign "$s" ;;
  esac
done
warm_done
gpu_done
if [[ $steps == *,save,* ]]; then
  step "save the compiled modules"
  PYTHON=$py GPU_MODULES_PART_MB=15 GPU_MODULES_ONLY=${SAVE_ONLY:-} \
    bash "$root/ci/gpu_modules.sh" save "release" >>"$log" 2>&1
fi
step "done"
tail -c 11000 "$log"
