#!/usr/bin/env bash
# Issue 18 on the GPU: the production modes (CUDA-graph replay, ragged verify, skip-softmax)
# against one FlashInfer release, in one device call.
#
#   bash ci/h200_modes.sh [VERSION] [STEPS]
#
# VERSION: a release whose site is in $DIFFTEST_SITES/VERSION (staged by ci/stage_versions.sh
# and carried as .gpu-versions, as ci/h200_versions.sh does), or "installed" (default): the
# FlashInfer already importable. STEPS, comma-separated (default gpu,graph,ragged,skip):
#   gpu     tests/gpu/test_modes.py (pytest -n 4 --dist loadgroup): graph replay bit for bit
#           against eager and with host arguments changed since capture, ragged batches,
#           skip-softmax within its bound or IGNORES; JSON lines (GPU_TIMEOUT_S, default 200)
#   graph   difftest run --graph over fi-decode-xqa, fi-prefill-fa2, fi-decode-wrapper
#   ragged  difftest run --ragged over the paths that take ragged queries (fi-xqa-ragged,
#           fi-prefill-fa2, fi-prefill-fa3, fi-context-fmha-v2, fi-decode-trtllm-gen,
#           fi-context-trtllm-gen: those not available here say why in the report)
#   skip    difftest run --skip-softmax over fi-decode-xqa and fi-context-fmha-v2
# Each campaign has its own budget (GRAPH_BUDGET_S, RAGGED_BUDGET_S, SKIP_BUDGET_S, default 80 s
# each, shrinking included) and at most CAMPAIGN_VARIANTS compile variants (default 3);
# GRAPH_PATHS, RAGGED_PATHS, SKIP_PATHS replace a campaign's paths.
# Output (at most 8 files) to DIFFTEST_GPU_OUT, else $OUT, else difftest-out/gpu:
#   modes-VERSION.log, gpu-modes-VERSION.jsonl, graph-VERSION.json, ragged-VERSION.json,
#   skip-VERSION.json, findings-modes-VERSION.tgz (each campaign's run directory: findings,
#   group repros, groups.json)
# Time (H200, cold JIT): XQA 10-48 s, fa2 20-120 s, the decode wrapper 60-120 s, FMHAv2
# 170-365 s per module; with .gpu-modules carried (warm) the whole script is about 6-8 minutes,
# cold up to the device call's 10 minutes (lower the budgets, or run STEPS in two calls).
set -u
if [ $# -gt 2 ] || [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
version=${1:-installed}
steps=,${2:-gpu,graph,ragged,skip},
for s in ${steps//,/ }; do
  case $s in gpu | graph | ragged | skip) ;; *)
    echo "h200_modes: unknown step '$s' (gpu, graph, ragged, skip)" >&2
    exit 2
    ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=ci/release_sites.sh
source "$root/ci/release_sites.sh"
if [ "$version" != installed ]; then
  enter_release "$version" # one site for this release, as ci/h200_versions.sh makes them
else
  site_log=$(mktemp)
  export PYTHONPATH=$base_path
fi
name=modes-$version
# shellcheck source=ci/h200_setup.sh
source "$root/ci/h200_setup.sh"
cat "$site_log" >>"$log" && rm -f "$site_log"
variants=${CAMPAIGN_VARIANTS:-3}

campaign() { # campaign NAME BUDGET PATHS FLAGS...: one bounded difftest run into $work/NAME
  local what=$1 budget=$2 paths=$3
  shift 3
  step "$what: difftest run $* over $paths (budget ${budget} s, $variants variants)"
  MAX_JOBS=${RUN_MAX_JOBS:-16} timeout $((budget + 60)) "$py" -m difftest run "$@" \
    --paths "$paths" --budget-s "$budget" --variants "$variants" --cases-per-variant 12 \
    --out "$work/$what" --json "$out/$what-$version.json" >>"$log" 2>&1
  echo "exit $? ($what)" >>"$log"
}

if [[ $steps == *,gpu,* ]]; then
  step "tests/gpu/test_modes.py"
  mkdir -p "$work/gpu"
  MAX_JOBS=${GPU_MAX_JOBS:-4} DIFFTEST_GPU_OUT=$work/gpu timeout "${GPU_TIMEOUT_S:-200}" \
    "$py" -m pytest -p no:cacheprovider -n 4 --dist loadgroup tests/gpu/test_modes.py -q \
    -rs --durations=15 >>"$log" 2>&1
  echo "exit $? (gpu)" >>"$log"
  cp "$work/gpu/gpu_results.jsonl" "$out/gpu-modes-$version.jsonl" 2>>"$log"
fi
if [[ $steps == *,graph,* ]]; then
  campaign graph "${GRAPH_BUDGET_S:-80}" \
    "${GRAPH_PATHS:-fi-decode-xqa,fi-prefill-fa2,fi-decode-wrapper}" --graph
fi
if [[ $steps == *,ragged,* ]]; then
  campaign ragged "${RAGGED_BUDGET_S:-80}" \
    "${RAGGED_PATHS:-fi-xqa-ragged,fi-prefill-fa2,fi-prefill-fa3,fi-context-fmha-v2,fi-decode-trtllm-gen,fi-context-trtllm-gen}" \
    --ragged
fi
if [[ $steps == *,skip,* ]]; then
  campaign skip "${SKIP_BUDGET_S:-80}" \
    "${SKIP_PATHS:-fi-decode-xqa,fi-context-fmha-v2}" --skip-softmax
fi
ran=$(cd "$work" && for d in graph ragged skip; do [ -d "$d" ] && echo "$d"; done)
# shellcheck disable=SC2086  # one word per campaign folder
[ -n "$ran" ] && (cd "$work" && tar czf "$out/findings-modes-$version.tgz" $ran)
step "done"
tail -c 11000 "$log"
