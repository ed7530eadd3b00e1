#!/usr/bin/env bash
# Issue 16's GPU figures in one call: difftest's throughput beside FlashInfer's own test.
#
#   bash ci/h200_speed.sh [STEPS]        (on the device machine: bash ci/device_runner.sh ...)
#
# STEPS, comma-separated (default small,fitest,presets,isolation), each under its own timeout:
#   fitest     FlashInfer's test_xqa_batch_decode on its first shape in bf16
#              (-k "4-4-64-4-2 and bf16-bf16-bf16": 48 cases), staged by
#              ci/stage_flashinfer_tests.sh into .flashinfer-tests/VERSION (carry it);
#              per-case durations from its JUnit XML: cold first case, warm median
#   small      difftest bench --limits small --paths fi-decode-xqa (FlashInfer's
#              test_xqa_batch_decode shape, one path + the oracle), SMALL_S seconds (default
#              60) at the default packing and again with --pack 1 (one case a launch, as
#              FlashInfer's test runs them), then with --pack N for each N in SMALL_PACKS
#              (space-separated, default none; the default packing at these limits is 64,
#              Limits.gpu_pack). Warm, as FlashInfer's figure is its warm median:
#              the same bench run for 1 s in the background first builds its modules, the
#              variants its findings are rechecked on (--warmup-processes 2) and the
#              generator's Triton kernels, and the measured benches run after the background
#              builds end (run beside them, as before 2026-12-03, the first one paid ~20 s of
#              first-use builds and CPU contention inside a 45 s budget); SMALL_WORKERS
#              (space-separated, default none): the default-packing bench again with
#              --workers N for each (bench-small-pack-default-wN), and for each packing in
#              SMALL_WORKERS_PACKS (space-separated, default "default"; bench-small-pack-P-wN);
#              SAMPLE=1 runs each of those under benchmarks/sample_processes.py --gpu (each
#              process's and thread's share of a core, and the device's utilisation, per 5 s
#              window: into the log, the samples into reports.tgz); PROFILE_POOLED=1 profiles
#              each of them as PROFILE=1 profiles the one-worker bench (profile-small-P-wN.txt);
#              SMALL_LIMIT_S (default SMALL_S + 120) is each one's time limit. A bench's warmup counts against its budget:
#              at SMALL_S=20 (2026-12-05) the warmups took 11-12 s and the default-packing
#              bench ran no case; keep SMALL_S >= 45. SMALL_ONE_WORKER (space-separated,
#              default "default 1" and SMALL_PACKS): the one-worker benches' packings; set
#              empty to run only the SMALL_WORKERS benches. SMALL_PREBUILD_CASES=N: the
#              background build covers the variants of the bench's first N cases (a bench
#              builds those of its first 256 before it starts, with --max-cases N its first
#              N); without it a pooled bench met and built the later ones itself (16 s of a
#              30 s four-worker bench that ran 15,424 cases, Run 32); SMALL_PREBUILD_TIMEOUT_S
#              (default 300) bounds that build
#   presets    difftest bench, default GPU limits, --preset llama-3.1-8b and gpt-oss-120b,
#              paths PRESET_PATHS (default fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2),
#              PRESET_S seconds each (default 90; SPEED_PRESETS: other presets, space-separated), the first 256 cases in 2 compile variants:
#              the headline kernel time / (wall - compile), cases/s per path, the phase
#              shares; PRESET_WORKERS (space-separated, default 1): each bench again with
#              --workers N (launches at once, one isolated worker each; bench-PRESET-wN). Their modules are built in the background beforehand (the same bench,
#              run for 1 s, builds exactly what the measured one warms up), so the measured
#              benches find them built: a warm campaign
#   isolation  difftest run --max-cases 200 on fi-decode-xqa, one template, seed 16: its
#              modules built in the background (the same run, in process), then --isolation
#              process and --isolation none on the same cases: the ratio of the commands' wall
#              times (start-up included, as a user waits), and of the reports' (the campaign);
#              ISOLATION_ROUNDS pairs (default 3), in alternating order: each round's ratios
#              and their medians
# Order: fitest alone (its own JIT build, then its cases); then the background builds; then,
# once they end, the small benches, the presets and the isolation runs, warm.
# Output to DIFFTEST_GPU_OUT, else difftest-out/gpu: speed.log, speed.json (the figures,
# summarised by ci/speed_figures.py after each step, so a call cut short keeps what it
# measured), reports.tgz (every bench and run report as JSON, and FlashInfer's JUnit XML),
# findings.tgz (every run's groups/ and findings/: the repros of what they found).
# Expected time, cold: about 8 minutes (XQA JIT 10-48 s, fa2 20-120 s, decode wrapper 60-120 s,
# built side by side). FLASHINFER_TEST_VERSION picks the staged test (default the release under
# test, else 0.6.16.post4).
# PROFILE=1 profiles the small bench at the default packing and the first preset bench: the
# parent under cProfile, each worker by DIFFTEST_PROFILE_DIR (difftest/execution/isolation/
# worker.py); profile-NAME.txt in the output folder lists each process's top functions
# (their figures are slower than unprofiled ones: read the shares, not the rates).
# SPEED_VERSION=V measures a release staged in .gpu-versions/ (bash ci/stage_versions.sh; carry
# [".gpu-versions", ".gpu-modules", ".flashinfer-tests"]) in its own site and JIT cache, as
# ci/h200_release.sh does, with .gpu-modules' archives for it restored first; then run this
# script directly, not through ci/device_runner.sh (which installs the .gpu kit instead).
set -u
steps=${1:-small,fitest,presets,isolation}
name=speed
if [ -n "${SPEED_VERSION:-}" ]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  # shellcheck source=ci/release_sites.sh
  source "$root/ci/release_sites.sh"
  enter_release "$SPEED_VERSION"
  name=speed-$SPEED_VERSION
fi
source "$(dirname "$0")/h200_setup.sh"
[ -n "${SPEED_VERSION:-}" ] && release_logged
if [ -z "${FLASHINFER_TEST_VERSION:-}" ] && [ -z "${SPEED_VERSION:-}" ]; then
  # the release installed, when its test is staged
  installed=$("$py" -c 'import flashinfer; print(flashinfer.__version__)' 2>/dev/null)
  [ -d "$root/.flashinfer-tests/$installed" ] && FLASHINFER_TEST_VERSION=$installed
fi
version=${FLASHINFER_TEST_VERSION:-${SPEED_VERSION:-0.6.16.post4}}
reports=$work/reports
mkdir -p "$reports"
small_s=${SMALL_S:-60}
preset_s=${PRESET_S:-90}
isolation_rounds=${ISOLATION_ROUNDS:-3}
preset_paths=${PRESET_PATHS:-fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2}
presets=${SPEED_PRESETS:-llama-3.1-8b gpt-oss-120b}
preset_workers=${PRESET_WORKERS:-1}
profiled() { # NAME: the command prefix (and environment) that profiles a run named NAME
  if [ "${PROFILE:-0}" = 1 ]; then
    mkdir -p "$work/prof-$1"
    echo env "DIFFTEST_PROFILE_DIR=$work/prof-$1" "$py" -m cProfile -o "$work/prof-$1/parent.prof"
  else
    echo "$py"
  fi
}
profile_text() { # NAME: each profile of the run NAME, its top functions, into the output
  [ -d "$work/prof-$1" ] || return 0
  "$py" - "$work/prof-$1" >"$out/profile-$1.txt" 2>&1 <<'PY'
import pstats, sys
from pathlib import Path

for f in sorted(Path(sys.argv[1]).glob("*.prof")):
    try:
        stats = pstats.Stats(str(f), stream=sys.stdout)
    except Exception as e:  # one unreadable file must not hide the others
        print(f"==== {f.name}: not readable ({type(e).__name__}: {e})")
        continue
    for order in ("cumulative", "tottime"):
        print(f"==== {f.name} by {order}")
        stats.sort_stats(order).print_stats(45)
    print(f"==== {f.name}: who waits (sleep, poll, lock)")
    stats.print_callers("sleep|poll|acquire")
PY
}
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
step() { echo "== $(date +%T) $*" >>"$log"; }
summary() { # the figures so far: a call cut short by its limit still brings back what it measured
  "$py" "$root/ci/speed_figures.py" "$reports" "$out" >"$work/figures.txt" 2>&1 ||
    cat "$work/figures.txt" >>"$log"
  tar czf "$out/reports.tgz" -C "$work" reports >>"$log" 2>&1
  # the runs' group repros and findings: nothing found is left on the machine
  (cd "$work" && tar czf "$out/findings.tgz" o-*/groups o-*/groups.json o-*/findings o-*/packed 2>/dev/null)
}
isolated_run() { # NAME CASES ISOLATION: fi-decode-xqa, one template, seed 16; the command's
  # own wall time (start-up included, as a user waits for it) into $reports/run-NAME.wall
  local t0 rc
  t0=$(date +%s.%N)
  timeout 300 "$py" -m difftest run --paths fi-decode-xqa --max-cases "$2" \
    --cases-per-variant 200 --seed 16 --isolation "$3" --no-shrink --budget-s 200 \
    --json "$reports/run-$1.json" --out "$work/o-$1"
  rc=$?
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' >"$reports/run-$1.wall"
  return $rc
}
preset_bench() { # TIMEOUT_S PRESET BUDGET_S JSON [RUNNER [WORKERS]]: the preset benches, built
  # and measured alike
  # shellcheck disable=SC2086  # the runner is words
  timeout "$1" ${5:-$py} -m difftest bench --preset "$2" --paths "$preset_paths" \
    --cases-per-variant 128 --warmup-processes 6 --budget-s "$3" --json "$4" \
    --workers "${6:-1}" --out "$work/o-$2-$3-w${6:-1}"
}
if has fitest; then
  step "fitest (FlashInfer $version's test_xqa_batch_decode)"
  dir=$root/.flashinfer-tests/$version
  if [ ! -f "$dir/tests/attention/test_xqa_batch_decode.py" ]; then
    echo "not staged: $dir (bash ci/stage_flashinfer_tests.sh, then carry .flashinfer-tests)" >>"$log"
  else
    for w in "$dir"/einops-*.whl; do
      [ -f "$w" ] && "$py" -m pip install -q --no-deps --no-index "$w" >>"$log" 2>&1
    done
    (cd "$dir" && timeout 240 "$py" -m pytest -q -p no:cacheprovider \
      "tests/attention/test_xqa_batch_decode.py::test_xqa_batch_decode" \
      -k "4-4-64-4-2 and bf16-bf16-bf16" --junitxml "$reports/fitest.xml" >>"$log" 2>&1)
    echo "exit $?" >>"$log"
    summary
  fi
fi
builders=()
if has presets; then
  for p in $presets; do
    step "building preset $p's modules in the background"
    (preset_bench 400 "$p" 1 "$work/prebuild-$p.json" >"$work/prebuild-$p.log" 2>&1
      echo "exit $?" >>"$work/prebuild-$p.log") &
    builders+=($!)
  done
fi
small_bench() { # TIMEOUT_S BUDGET_S JSON OUT [RUNNER [ARGS...]]: the small benches, built and
  # measured alike
  local limit=$1 budget=$2 json=$3 dir=$4 runner=${5:-$py}
  shift $(($# < 5 ? $# : 5))
  # shellcheck disable=SC2086  # the runner is words
  timeout "$limit" $runner -m difftest bench --limits small --paths fi-decode-xqa \
    --warmup-processes 2 "$@" --budget-s "$budget" --json "$json" --out "$dir"
}
if has small; then
  step "building the small benches' modules in the background (the same bench, 1 s${SMALL_PREBUILD_CASES:+, the variants of its first $SMALL_PREBUILD_CASES cases})"
  prebuild=()
  [ -n "${SMALL_PREBUILD_CASES:-}" ] && prebuild=(--max-cases "$SMALL_PREBUILD_CASES")
  (small_bench "${SMALL_PREBUILD_TIMEOUT_S:-300}" 1 "$work/prebuild-small.json" \
    "$work/o-small-prebuild" "$py" ${prebuild[@]+"${prebuild[@]}"} >"$work/prebuild-small.log" 2>&1
    echo "exit $?" >>"$work/prebuild-small.log") &
  builders+=($!)
fi
if has isolation; then
  step "building the isolation runs' modules in the background (the same 200 cases, in process)"
  (isolated_run build 200 none >"$work/prebuild-isolation.log" 2>&1
    echo "exit $?" >>"$work/prebuild-isolation.log") &
  builders+=($!)
fi
if [ ${#builders[@]} -gt 0 ]; then
  step "waiting for the background builds"
  for b in "${builders[@]}"; do wait "$b"; done
  for f in "$work"/prebuild-*.log; do
    echo "-- $(basename "$f"):" >>"$log"
    tail -n 30 "$f" >>"$log"
  done
fi
if has small; then
  for pack in ${SMALL_ONE_WORKER-default 1 ${SMALL_PACKS:-}}; do
    step "small (pack $pack, warm)"
    args=()
    [ "$pack" = default ] || args=(--pack "$pack")
    runner=$py
    [ "$pack" = default ] && runner=$(profiled small)
    small_bench $((small_s + 120)) "$small_s" "$reports/bench-small-pack-$pack.json" \
      "$work/o-small-$pack" "$runner" "${args[@]}" >>"$log" 2>&1
    echo "exit $?" >>"$log"
    [ "$pack" = default ] && profile_text small
    summary
  done
  for pack in ${SMALL_WORKERS_PACKS:-default}; do
    for w in ${SMALL_WORKERS:-}; do
      step "small (pack $pack, warm, $w workers)"
      args=(--workers "$w")
      [ "$pack" = default ] || args+=(--pack "$pack")
      runner=$py
      [ "${PROFILE_POOLED:-0}" = 1 ] && runner=$(PROFILE=1 profiled "small-$pack-w$w")
      if [ "${SAMPLE:-0}" = 1 ]; then
        runner="$py $root/benchmarks/sample_processes.py --gpu --every 0.5 $reports/sample-small-pack-$pack-w$w.json -- $runner"
      fi
      small_bench "${SMALL_LIMIT_S:-$((small_s + 120))}" "$small_s" \
        "$reports/bench-small-pack-$pack-w$w.json" "$work/o-small-$pack-w$w" "$runner" \
        "${args[@]}" >>"$log" 2>&1
      echo "exit $?" >>"$log"
      [ "${PROFILE_POOLED:-0}" = 1 ] && profile_text "small-$pack-w$w"
      summary
    done
  done
fi
if has presets; then
  first=1
  for p in $presets; do
    for w in $preset_workers; do
      step "preset $p (warm, $w worker(s))"
      runner=$py
      [ $first = 1 ] && runner=$(profiled "$p")
      name=bench-$p
      [ "$w" = 1 ] || name=bench-$p-w$w
      preset_bench $((preset_s + 240)) "$p" "$preset_s" "$reports/$name.json" "$runner" "$w" \
        >>"$log" 2>&1
      echo "exit $?" >>"$log"
      [ $first = 1 ] && profile_text "$p"
      first=0
      summary
    done
  done
fi
if has isolation; then
  for round in $(seq 1 "$isolation_rounds"); do
    order="process none"
    [ $((round % 2)) = 0 ] && order="none process"  # alternating: a drift favours neither
    for iso in $order; do
      step "isolation $iso, round $round"
      isolated_run "$iso-$round" 200 "$iso" >>"$log" 2>&1
      echo "exit $?" >>"$log"
    done
    summary
  done
fi
summary
cat "$work/figures.txt" >>"$log"
cat "$log"
