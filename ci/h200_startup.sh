#!/usr/bin/env bash
# Issue 16, where an isolated run's extra time goes on a GPU machine: what a worker's start-up
# costs, part by part, and the isolated/in-process pair with and without compile-ahead.
#
#   bash ci/h200_startup.sh          (on the device machine: bash ci/device_runner.sh ...)
#
# Each part is timed in a fresh interpreter (as a worker starts): import torch; the CUDA
# context; import flashinfer; the campaign's own imports (its CLI's parser, which imports every
# command); then a worker (difftest.execution.isolation.worker.WorkerProcess for
# fi-decode-xqa on cuda) from spawn to ready, three times. Then the 200-case run of
# ci/h200_speed.sh (fi-decode-xqa, seed 16) in process (building its modules), isolated, in
# process again, and isolated and in process with --compile-ahead 0: each command's wall time
# and its campaign's. Output to DIFFTEST_GPU_OUT: startup.log (every figure), startup.json
# (the runs' reports' wall and time split).
set -u
name=startup
source "$(dirname "$0")/h200_setup.sh"
for part in "import torch" \
  "import torch; torch.zeros(1, device='cuda')" \
  "import torch; torch.zeros(1, device='cuda'); import flashinfer" \
  "from difftest.interfaces.cli import build_parser; build_parser()"; do
  t0=$(date +%s.%N)
  "$py" -c "$part" >>"$log" 2>&1
  echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s: $part" >>"$log"
done
# (-c, not a script on stdin: a spawned worker re-imports its parent's main file, and stdin
# has none)
"$py" -c '
import time

from difftest.execution.isolation.worker import WorkerProcess, WorkerSettings

for _ in range(3):
    start = time.monotonic()
    worker = WorkerProcess(
        WorkerSettings((), ("fi-decode-xqa",), "cuda", None, 1)
    )
    worker.wait_ready(300)
    print(f"{time.monotonic() - start:.2f} s: a worker for fi-decode-xqa, spawn to ready")
    worker.stop(1.0, polite=True)
' >>"$log" 2>&1
run() { # NAME ISOLATION [ARGS...]
  local t0
  t0=$(date +%s.%N)
  timeout 200 "$py" -m difftest run --paths fi-decode-xqa --max-cases 200 \
    --cases-per-variant 200 --seed 16 --isolation "$2" --no-shrink --budget-s 150 \
    --json "$work/run-$1.json" --out "$work/o-$1" "${@:3}" >"$work/run-$1.log" 2>&1
  echo "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s: command, run $1 ($2 ${*:3})" >>"$log"
}
run build none
run process process
run none none
run process-ca0 process --compile-ahead 0
run none-ca0 none --compile-ahead 0
"$py" - "$work" "$out/startup.json" >>"$log" 2>&1 <<'PY'
import json, sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for f in sorted(work.glob("run-*.json")):
    d = json.loads(f.read_text())
    runs[f.stem] = {"wall_s": d["wall_s"], "cases": d["cases"], "timings": d["timings"]}
    print(f"{f.stem}: campaign {d['wall_s']:.2f} s, {d['cases']} cases, {d['timings']}")
out.write_text(json.dumps(runs, indent=1) + "\n")
PY
cat "$log"
