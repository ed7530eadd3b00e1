#!/usr/bin/env bash
# Issue 16, compile behind execution, in one call: the same cold campaign twice, building each
# compile variant's modules on first use (--compile-ahead 0) and behind execution
# (--compile-ahead N), each with an empty JIT cache of its own, so both compile every module.
#
#   bash ci/h200_compile_ahead.sh          (on the device machine: bash ci/device_runner.sh ...,
#                                           carry [".gpu"] only: restored .gpu-modules would be
#                                           found before the empty cache and nothing would build)
#
# Knobs: MODES (default "inline ahead"; "ahead" alone gives one run the whole call), PATHS
# (default fi-decode-xqa,fi-prefill-fa2), AHEAD (processes, default 4), VARIANTS
# (default 8), PER_VARIANT (default 16), BUDGET_S (per run, default 200), SEED (default 16).
# Output (at most 8 files) to DIFFTEST_GPU_OUT, else difftest-out/gpu: compile_ahead.log,
# run-inline.json, run-ahead.json, findings.tgz (the runs' groups/ and findings/),
# compile_ahead.json (the figures: cases, wall, compile_wait,
# compile_wait / wall, build work done behind, failed builds).
# Expected time: 2 x BUDGET_S plus start-up, about 7-8 minutes (XQA builds 10-48 s, fa2 20-120 s
# cold; either run stops at its budget).
set -u
name=compile_ahead
source "$(dirname "$0")/h200_setup.sh"
paths=${PATHS:-fi-decode-xqa,fi-prefill-fa2}
ahead=${AHEAD:-4}
budget=${BUDGET_S:-200}
for mode in ${MODES:-inline ahead}; do
  n=0
  [ "$mode" = ahead ] && n=$ahead
  cache=$work/jit-$mode
  mkdir -p "$cache"
  echo "== $(date +%T) $mode (--compile-ahead $n, empty JIT cache $cache)" >>"$log"
  FLASHINFER_WORKSPACE_BASE=$cache timeout $((budget + 90)) "$py" -m difftest run \
    --paths "$paths" --variants "${VARIANTS:-8}" --cases-per-variant "${PER_VARIANT:-16}" \
    --seed "${SEED:-16}" --compile-ahead "$n" --no-shrink --budget-s "$budget" \
    --json "$out/run-$mode.json" --out "$work/o-$mode" >>"$log" 2>&1
  echo "exit $?" >>"$log"
done
# every run's group repros and findings come back too: nothing found is left on the machine
(cd "$work" && tar czf "$out/findings.tgz" o-*/groups o-*/groups.json o-*/findings o-*/packed 2>/dev/null)
"$py" - "$out" >>"$log" 2>&1 <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
fig = {}
for mode in ("inline", "ahead"):
    f = out / f"run-{mode}.json"
    if not f.exists():
        fig[mode] = "no report"
        continue
    d = json.loads(f.read_text())
    t, wall = d.get("timings", {}), d.get("wall_s") or 0.0
    ahead = d.get("compile_ahead") or {}
    # first launches of a variant load (ahead) or build (inline) its modules: both wait
    waited = t.get("compile_wait", 0.0) + t.get("compile", 0.0)
    fig[mode] = {
        "cases": d.get("cases"),
        "variants": d.get("variants"),
        "wall_s": wall,
        "waited_on_compiles_s": waited,
        "waited_share": waited / wall if wall else None,
        "first_launch_compile_s": t.get("compile", 0.0),
        "kernels_s": t.get("kernels", 0.0),
        "built_behind": ahead.get("builds"),
        "build_work_s": ahead.get("work_s"),
        "failed_builds": ahead.get("failed"),
        "stop_reason": d.get("stop_reason"),
    }
(out / "compile_ahead.json").write_text(json.dumps(fig, indent=1) + "\n")
print(json.dumps(fig, indent=1))
PY
cat "$log"
