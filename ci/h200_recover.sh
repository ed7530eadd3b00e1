#!/usr/bin/env bash
# Recover, in one call, the findings of a run whose repro files were lost, and check each
# recovered group against independent paths:
#
#   INDEX=N RUN_ARGS="<the lost run's difftest run options>" bash ci/h200_recover.sh
#                                    (on the device machine: bash ci/device_runner.sh ...)
#
# 1. ci/h200_recover_cases.py plans the lost run again (its options, the known triggers
#    avoided from the first case, as the run avoided them) and reruns cases INDEX-AROUND ..
#    INDEX+AROUND (AROUND default 12) with shrinking on: groups, shrunk repros, findings.
#    CASES=FILE instead: the case specs listed in FILE (a JSON list), run and shrunk alike.
# 2. each group's repro: `difftest explain` (where the error is: rows, heads, visible KV,
#    pages) and `difftest replay --paths CHECK_PATHS` (default torch-sdpa,torch-paged-online:
#    two PyTorch paths that share no code with the oracle's float64 reference or with the
#    kernels; if they agree with the oracle where the kernel does not, the oracle is not the
#    odd one out).
# PLUGIN: a module that registers the lost run's paths (when they are not built in).
# Output to DIFFTEST_GPU_OUT, else difftest-out/gpu: recover.log, recover.json (the rerun's
# report), checks.json (each replay's outcomes), findings.tgz (the rerun's folder and each
# explain's JSON). Expected time: the compiles of the window's variants, then at most the
# rerun's budget (RUN_ARGS' --budget-s) and a minute of checks.
set -u
name=recover
source "$(dirname "$0")/h200_setup.sh"
if { [ -z "${INDEX:-}" ] && [ -z "${CASES:-}" ]; } || [ -z "${RUN_ARGS:-}" ]; then
  echo "usage: INDEX=N|CASES=FILE RUN_ARGS='...' bash ci/h200_recover.sh" | tee -a "$log" >&2
  exit 2
fi
which=(--index "${INDEX:-}" --around "${AROUND:-12}")
[ -n "${CASES:-}" ] && which=(--cases "$CASES")
check_paths=${CHECK_PATHS:-torch-sdpa,torch-paged-online}
plugin=()  # PLUGIN: a module registering the lost run's paths, if they are not built in
[ -n "${PLUGIN:-}" ] && plugin=(--plugin "$PLUGIN")
echo "== $(date +%T) rerunning ${CASES:-the cases around $INDEX}: $RUN_ARGS" >>"$log"
# shellcheck disable=SC2086  # RUN_ARGS is words
timeout "${RECOVER_TIMEOUT_S:-420}" "$py" "$root/ci/h200_recover_cases.py" "${which[@]}" --report "$out/recover.json" -- "${plugin[@]}" $RUN_ARGS --out "$work/o-recover" \
  >>"$log" 2>&1
echo "exit $?" >>"$log"
n=0
for f in "$work"/o-recover/groups/*.repro.json; do
  [ -f "$f" ] || continue
  n=$((n + 1))
  echo "== $(date +%T) checking $(basename "$f")" >>"$log"
  timeout 120 "$py" -m difftest explain "${plugin[@]}" "$f" --json "$work/explain-$n.json" >>"$log" 2>&1
  echo "explain exit $?" >>"$log"
  timeout 120 "$py" -m difftest replay "$f" --paths "$check_paths" \
    --json "$work/check-$n.json" >>"$log" 2>&1
  echo "replay exit $?" >>"$log"
done
"$py" - "$work" "$out/checks.json" <<'PY' >>"$log" 2>&1
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
checks = {f.name: json.loads(f.read_text()) for f in sorted(work.glob("check-*.json"))}
Path(sys.argv[2]).write_text(json.dumps(checks, indent=1))
print(f"{len(checks)} replay check(s) written")
PY
(cd "$work" && tar czf "$out/findings.tgz" o-recover explain-*.json 2>/dev/null)
cat "$log"
