#!/usr/bin/env bash
# Issue 16's first figure, a warm GPU campaign at the default limits: kernel time / (wall -
# compile), measured on a campaign whose modules are built, in one call.
#
#   bash ci/h200_warm_campaign.sh          (on the device machine: bash ci/device_runner.sh ...)
#
# A default `difftest run` (isolated, shrinking on, the default GPU limits and packing) on
# PATHS (default fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2) with seed SEED (default 22)
# for BUDGET_S seconds (default 200) builds its modules (cold); then the same run again, warm.
# WARM_BY=budget (the default): the warm run has the cold run's budget and no case limit, as a
# user's campaign has (shrinking keeps to its share of the budget). WARM_BY=cases: the warm run
# stops after as many cases as the cold one ran (--max-cases; its budget WARM_BUDGET_S, default
# 300, only a backstop), and what is left of that budget goes to shrinking. WARM_RUNS (default
# 1): warm runs, one after another; a warm run can draw variants the cold one did not reach and
# build them, so the last of several is the warmest (the earlier ones' reports are
# run-warm-1.json, ...). WARM_WORKERS (default none): a list of worker counts ("1 4 8"), one
# more warm run each with `--workers N` (run-warm-wN.json), after the WARM_RUNS (WARM_RUNS=0:
# these alone). Several workers share the GPU: each times its kernels on the host's clock around
# a device sync, which then also counts the other workers' queued work, so the summary also
# gives each run's share at the kernel time per case of its one-worker run (kernel_share_at_w1),
# the figure that cannot be inflated by sharing. The cold run must be long enough to build what
# the warm ones draw: at BUDGET_S=50 (2026-12-05) it ran no case (35 s waiting on compiles, 16
# builds stopped unfinished) and the warm runs went on building; at 100, the warm run waited
# 0.35 s on compiles. Output
# (DIFFTEST_GPU_OUT, else difftest-out/gpu): warm_campaign.log, run-cold.json, run-warm.json,
# warm_campaign.json (per run: cases, wall, kernels, the compile time either waited, kernel /
# (wall - compile), the phases' shares), findings.tgz.
# WARMUP_VARIANTS=N (default 0: none) builds the first N compile variants of the campaign's
# plan between the cold run and the warm ones (`difftest warmup --processes`, WARMUP_JOBS
# processes, default 12, for at most WARMUP_S seconds, default 300), so that the warm runs
# build nothing: the cold run of 100 s reached 7 variants, the warm runs drew 21-31 (Run 27).
# PROFILE_RUN=NAME (cold, warm, warm-K or warm-wN) profiles that run: its parent under cProfile,
# each worker by DIFFTEST_PROFILE_DIR (difftest/execution/isolation/worker.py); profile-NAME.txt
# lists each process's top functions (a profiled run is slower: read its shares, not its rate).
# SAMPLE_RUN=NAME runs that run under benchmarks/sample_processes.py --gpu: each process's and
# thread's share of a core and the device's utilisation, per 5 s window, in sample-NAME.json
# (which side waits when several workers share the device).
# PACKED_RUNS (default none): a list of PxN, one more warm run each with `--pack P --workers N`
# (run-warm-pP-wN.json): larger launches at the default limits (16 cases a launch fit there:
# the planner's launches of 16 are not split) issue the same kernels and waits for twice the
# cases. MPS_WORKERS (default none): a list of N or PxN, one more warm run each with
# `--workers N` (and `--pack P`) under CUDA's Multi-Process Service
# (run-warm-mps-wN.json, run-warm-mps-pP-wN.json): without it the workers' CUDA
# contexts take turns on the device (time slices), with it their kernels can run side by side.
# The script starts its own MPS control daemon (pipe and log folders in its scratch folder,
# nothing else of the device's settings touched) for that run and quits it after; where
# nvidia-cuda-mps-control is missing or the daemon does not start, the log says so and the run
# is not made. After the run the log holds the daemon's log (the clients it served).
# TRACE_RUN=NAME traces that run's device activity and writes timeline-NAME.txt by
# benchmarks/device_timeline.py: how long some kernel ran on the device, how many at once, and
# whose (oracle, store, the paths' kernels, torch's). Under Nsight Systems where `nsys` is
# installed (every process traced, its first NSYS_SKIP_S seconds, default 5, left out); else
# (the lent machines have Nsight Compute only) each worker records a window of its own kernels
# with torch.profiler (difftest/execution/device_trace.py; DEVICE_TRACE_WINDOW=START,LENGTH in
# seconds after it is ready, default 20,5; DEVICE_TRACE_WORKERS=N: only the first N workers
# trace, since eight windows at once lost most of their kernels and slowed the run, Run 44) and
# the timeline covers the span most windows share. A traced run is slower: read its shares, not its rate. An MPS_WORKERS entry N+trace
# (or PxN+trace) is one more MPS run of that shape, traced so (run-warm-mps-wN-trace.json,
# timeline-warm-mps-wN-trace.txt): MPS_WORKERS="8 8+trace" gives the untraced figure and the trace.
# An MPS_WORKERS entry ending in +env (8+env, 8+trace+env) runs with RUN_ENV, VAR=VALUE words
# (RUN_ENV=PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), its files named ...-env.
# Every run's workers write their CUDA allocator's counters (DIFFTEST_ALLOCATOR_DIR,
# difftest/execution/isolation/worker.py), summed in allocator-NAME.txt: cudaMalloc and
# cudaFree calls (each cudaFree waits for the device), retries and failures at the memory
# share, and each launch's peak against its pool's bytes (what a launch's share would take).
# Expected time: BUDGET_S plus the warm run plus start-ups.
set -u
name=warm_campaign
source "$(dirname "$0")/h200_setup.sh"
paths=${PATHS:-fi-decode-xqa,fi-decode-wrapper,fi-prefill-fa2}
seed=${SEED:-22}
run() { # NAME BUDGET_S [ARGS...]
  echo "== $(date +%T) $1 (budget $2 s ${*:3})" >>"$log"
  local runner=("$py")
  if [ "${PROFILE_RUN:-}" = "$1" ]; then
    mkdir -p "$work/prof"
    runner=(env "DIFFTEST_PROFILE_DIR=$work/prof" "$py" -m cProfile -o "$work/prof/parent.prof")
  fi
  if [ "${SAMPLE_RUN:-}" = "$1" ]; then
    runner=("$py" "$root/benchmarks/sample_processes.py" --gpu --every 0.5 "$out/sample-$1.json" -- "${runner[@]}")
  fi
  if [ "${TRACE_RUN:-}" = "$1" ]; then
    if command -v nsys >/dev/null; then
      runner=(nsys profile --trace=cuda --sample=none --cpuctxsw=none --force-overwrite=true
        -o "$work/nsys-$1" "${runner[@]}")
    else
      echo "TRACE_RUN: no nsys here: each worker records its window (${DEVICE_TRACE_WINDOW:-20,5})" >>"$log"
      runner=(env "DIFFTEST_DEVICE_TRACE_DIR=$work/trace-$1"
        "DIFFTEST_DEVICE_TRACE_WINDOW=${DEVICE_TRACE_WINDOW:-20,5}"
        "DIFFTEST_DEVICE_TRACE_WORKERS=${DEVICE_TRACE_WORKERS:-}" "${runner[@]}")
    fi
  fi
  # shellcheck disable=SC2086 # run_env: VAR=VALUE words (an MPS entry's +env)
  timeout $(($2 + 120)) env "DIFFTEST_ALLOCATOR_DIR=$work/alloc-$1" ${run_env:-} "${runner[@]}" -m difftest run \
    --paths "$paths" --seed "$seed" --budget-s "$2" --json "$out/run-$1.json" --out "$work/o-$1" \
    "${@:3}" >>"$log" 2>&1
  echo "exit $?" >>"$log"
  allocator_text "$1"
  [ "${PROFILE_RUN:-}" = "$1" ] && profile_text "$1"
  if [ "${TRACE_RUN:-}" = "$1" ] && [ -f "$work/nsys-$1.nsys-rep" ]; then
    nsys export --type sqlite --force-overwrite=true -o "$work/nsys-$1.sqlite" \
      "$work/nsys-$1.nsys-rep" >>"$log" 2>&1
    "$py" "$root/benchmarks/device_timeline.py" "$work/nsys-$1.sqlite" --skip-s "${NSYS_SKIP_S:-5}" \
      >"$out/timeline-$1.txt" 2>&1
  elif [ "${TRACE_RUN:-}" = "$1" ]; then
    "$py" "$root/benchmarks/device_timeline.py" "$work/trace-$1" >"$out/timeline-$1.txt" 2>&1
  fi
  return 0
}
allocator_text() { # NAME: the run's workers' allocator counters and launch peaks (DIFFTEST_ALLOCATOR_DIR)
  "$py" - "$work/alloc-$1" >"$out/allocator-$1.txt" 2>&1 <<'PY'
import json, statistics, sys
from collections import Counter
from pathlib import Path

folder = Path(sys.argv[1])
total, messages, files = Counter(), 0, sorted(folder.glob("*.allocator.json"))
for f in files:
    record = json.loads(f.read_text())
    counters = record.get("counters") or {}
    messages += record["messages"]
    total.update({k: v for k, v in counters.items() if k.startswith("num_")})
    print(f"worker {record['pid']}: {record['messages']} messages, share {record['memory_share']}, "
          f"reserved peak {record['reserved_peak'] / 2**30:.2f} GiB, "
          + ", ".join(f"{k} {v}" for k, v in sorted(counters.items()) if k.startswith("num_")))
per = ", ".join(f"{k} {v} ({v / max(messages, 1):.2f} a message)" for k, v in sorted(total.items()))
print(f"all {len(files)} workers: {messages} messages; {per or 'no counters (not a CUDA device?)'}")
# each message's launch: its pool's bytes against the allocator's peak while it ran
by_file = {f.name.split(".")[0]: [json.loads(x) for x in f.read_text().splitlines()]
           for f in sorted(folder.glob("*.launches.jsonl"))}  # each worker's lines, in order
lines = [x for own in by_file.values() for x in own]
read = [x for x in lines if x["pool_bytes"]]
fit = [x for x in read if not x["out_of_memory"]]
failed = [x for x in read if x["out_of_memory"]]
gib = 2**30
if fit:
    ratios = sorted(x["allocated_peak"] / x["pool_bytes"] for x in fit)
    q = lambda r: ratios[min(len(ratios) - 1, int(r * len(ratios)))]
    print(f"launches that fit: {len(fit)}; allocated peak / pool bytes: median {statistics.median(ratios):.2f}, "
          f"p90 {q(0.9):.2f}, max {ratios[-1]:.2f}; largest pool {max(x['pool_bytes'] for x in fit) / gib:.2f} GiB")
    for x in sorted(fit, key=lambda x: -x["allocated_peak"])[:5]:
        print(f"  peak {x['allocated_peak'] / gib:.2f} GiB allocated, {x['reserved_peak'] / gib:.2f} reserved: "
              f"{x['cases']} case(s), pool {x['pool_bytes'] / gib:.2f} GiB")
if failed:
    pools = sorted(x["pool_bytes"] / gib for x in failed)
    print(f"launches out of memory: {len(failed)}; their pools {pools[0]:.2f}-{pools[-1]:.2f} GiB "
          f"(median {statistics.median(pools):.2f}), of {sorted(Counter(x['cases'] for x in failed).items())} cases")
# what a launch takes beyond what its worker held before it (the last line's allocated_after)
extra, held = [], []
for own in by_file.values():
    before = None
    for x in own:
        if before is not None and x["pool_bytes"] and not x["out_of_memory"]:
            extra.append((x["allocated_peak"] - before - x["pool_bytes"]) / gib)
            held.append(before / gib)
        before = x.get("allocated_after")
if extra:
    extra.sort()
    print(f"a launch beyond what its worker held ({statistics.median(held):.2f} GiB median, "
          f"{max(held):.2f} most) and its pool: median {statistics.median(extra):.2f} GiB, "
          f"p90 {extra[int(0.9 * len(extra))]:.2f}, max {extra[-1]:.2f}")
# why each launch ran out of memory, in the allocator's words (its message, other processes
# left out): the share's limit or the device, and how much was cached but not handed out
import re

size = r"([\d.]+) ([KMG]i)?B"
def figure(pattern, text):
    m = re.search(pattern.replace("SIZE", size), text)
    return None if m is None else float(m.group(1)) * {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, None: 2**-30}[m.group(2)]
said = [x for x in failed if x.get("error")]
if said:
    keys = {
        "asked": r"Tried to allocate SIZE",
        "free on the device": r"of which SIZE is free",
        "this process in use": r"this process has SIZE memory in use",
        "allowed": r"SIZE allowed",
        "allocated by torch": r"SIZE is allocated by PyTorch",
        "cached, not handed out": r"SIZE is reserved by PyTorch but unallocated",
    }
    print(f"out of memory, in the allocator's words ({len(said)} messages; medians, GiB):")
    for name, pattern in keys.items():
        values = [v for v in (figure(pattern, x["error"]) for x in said) if v is not None]
        if values:
            print(f"  {name}: {statistics.median(values):.2f} ({len(values)} said it)")
    room = [x for x in said if (figure(keys["free on the device"], x["error"]) or 0) > (figure(keys["asked"], x["error"]) or 1e9)]
    print(f"  the device had more free than was asked: {len(room)} of {len(said)} (the share, not the device, was full)")
    kept = [(x["reserved_after_release"] - x["allocated_after"]) / gib for x in said if x.get("reserved_after_release") is not None]
    if kept:
        print(f"  cached but unused after giving back all it could: median {statistics.median(kept):.2f} GiB, max {max(kept):.2f}")
by_worker = Counter(w for w, own in by_file.items() for x in own if x["out_of_memory"])
if by_worker:
    print("out of memory by worker: " + ", ".join(f"{w} {n}" for w, n in by_worker.most_common()))
PY
}
profile_text() { # NAME: each process's profile of the run NAME, its top functions
  "$py" - "$work/prof" >"$out/profile-$1.txt" 2>&1 <<'PY'
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
        stats.sort_stats(order).print_stats(40)
PY
}
run cold "${BUDGET_S:-200}"
if [ "${WARMUP_VARIANTS:-0}" -gt 0 ]; then
  # the variants the warm runs will draw past the cold run's, built before them
  echo "== $(date +%T) warmup (${WARMUP_VARIANTS} variants, ${WARMUP_JOBS:-12} processes)" >>"$log"
  timeout "${WARMUP_S:-300}" "$py" -m difftest warmup --paths "$paths" --seed "$seed" \
    --variants "$WARMUP_VARIANTS" --processes --jobs "${WARMUP_JOBS:-12}" >>"$log" 2>&1
  echo "exit $?" >>"$log"
fi
cases=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["cases"])' \
  "$out/run-cold.json" 2>>"$log")
warm_runs=${WARM_RUNS:-1}
for k in $(seq 1 "$warm_runs"); do
  run_name=warm
  [ "$k" -lt "$warm_runs" ] && run_name=warm-$k
  if [ "${WARM_BY:-budget}" = budget ]; then
    run "$run_name" "${BUDGET_S:-200}"
  elif [ -n "$cases" ] && [ "$cases" -gt 0 ]; then
    run "$run_name" "${WARM_BUDGET_S:-300}" --max-cases "$cases"
  else
    echo "the cold run left no report with cases: no warm run" >>"$log"
  fi
done
for n in ${WARM_WORKERS:-}; do
  run "warm-w$n" "${BUDGET_S:-200}" --workers "$n"
done
mps_start() { # a private MPS control daemon; its folders exported for the runs after it
  local control
  control=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)
  if [ -z "$control" ]; then
    echo "MPS: nvidia-cuda-mps-control not found: no MPS run" >>"$log"
    return 1
  fi
  mkdir -p "$work/mps-pipe" "$work/mps-log"
  export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$work/mps-log
  if ! "$control" -d >>"$log" 2>&1; then
    echo "MPS: the control daemon did not start: no MPS run" >>"$log"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
  mps_control=$control
  echo "MPS: control daemon started ($control)" >>"$log"
}
mps_stop() {
  echo quit | "$mps_control" >>"$log" 2>&1
  sleep 2
  echo "MPS: the daemon's log:" >>"$log"
  tail -n 40 "$work/mps-log/control.log" >>"$log" 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
shape() { # N or PxN: the run's name suffix and its options
  case "$1" in
    *x*) suffix="p${1%x*}-w${1#*x}"; shape_args=(--pack "${1%x*}" --workers "${1#*x}") ;;
    *) suffix="w$1"; shape_args=(--workers "$1") ;;
  esac
}
for pn in ${PACKED_RUNS:-}; do
  shape "$pn"
  run "warm-$suffix" "${BUDGET_S:-200}" "${shape_args[@]}"
done
for n in ${MPS_WORKERS:-}; do
  mps_start || break
  traced= run_env=
  case "$n" in *+env) n=${n%+env}; run_env=${RUN_ENV:-}; suffix_env=-env ;; *) suffix_env= ;; esac
  case "$n" in *+trace) n=${n%+trace}; traced=-trace ;; esac
  shape "$n"
  [ -n "$run_env" ] && echo "warm-mps-$suffix$traced$suffix_env: with $run_env" >>"$log"
  if [ -n "$traced" ]; then
    TRACE_RUN="warm-mps-$suffix$traced$suffix_env" run "warm-mps-$suffix$traced$suffix_env" "${BUDGET_S:-200}" "${shape_args[@]}"
  else
    run "warm-mps-$suffix$suffix_env" "${BUDGET_S:-200}" "${shape_args[@]}"
  fi
  run_env=
  mps_stop
done
# the groups' repros, and each packed-only finding's (its whole launch: Runs 37 and 39 found XQA
# ones in every warm run, and their files stayed on the device)
(cd "$work" && tar czf "$out/findings.tgz" o-*/groups o-*/groups.json o-*/findings o-*/packed 2>/dev/null)
# each worker's launch lines (DIFFTEST_ALLOCATOR_DIR): peaks against pools and shapes
(cd "$work" && tar czf "$out/launches.tgz" alloc-*/*.launches.jsonl 2>/dev/null)
"$py" - "$out" >>"$log" 2>&1 <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
fig = {}
found = [p.name[4:-5] for p in out.glob("run-warm-*.json")]
# the earlier warm runs (warm-K), the last (warm), then the others (by worker count, packing,
# MPS), in the order they ran
earlier = sorted((n for n in found if n[5:].isdigit()), key=lambda n: int(n[5:]))
shaped = sorted(
    (n for n in found if n not in earlier), key=lambda n: (out / f"run-{n}.json").stat().st_mtime
)
names = earlier + shaped
for name in ("cold", *earlier, "warm", *shaped):
    f = out / f"run-{name}.json"
    if not f.exists():
        if name != "warm" or not names:  # WARM_RUNS=0 with WARM_WORKERS: no plain warm run
            fig[name] = "no report"
        continue
    d = json.loads(f.read_text())
    t, wall = d.get("timings", {}), d.get("wall_s") or 0.0
    # a variant's first launch loads or builds its modules; either way the campaign waits
    compiled = t.get("compile_wait", 0.0) + t.get("compile", 0.0)
    kernels = t.get("kernels", 0.0)
    rest = wall - compiled
    fig[name] = {
        "cases": d.get("cases"),
        "variants": d.get("variants"),
        "wall_s": wall,
        "kernels_s": kernels,
        "compile_s": compiled,
        "kernel_share": kernels / rest if rest > 0 else None,
        "kernel_s_per_case": kernels / d["cases"] if d.get("cases") else None,
        "phase_share": {k: round(v / wall, 4) for k, v in sorted(t.items())} if wall else {},
    }
# one worker's kernel time per case, where no other worker's work shares the device
one = fig.get("warm-w1") if isinstance(fig.get("warm-w1"), dict) else fig.get("warm")
if isinstance(one, dict) and one.get("kernel_s_per_case"):
    for name, f in fig.items():
        if isinstance(f, dict) and name in shaped and f["wall_s"] > f["compile_s"]:
            at = f["cases"] * one["kernel_s_per_case"] / (f["wall_s"] - f["compile_s"])
            f["kernel_share_at_w1"] = at
(out / "warm_campaign.json").write_text(json.dumps(fig, indent=1) + "\n")
print(json.dumps(fig, indent=1))
PY
cat "$log"
