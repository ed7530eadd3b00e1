#!/usr/bin/env bash
# Issue 15 on the GPU: one long campaign over the decode and prefill paths, grouped against the
# shipped corpus, so that each known bug is one KNOWN group and everything else shows as NEW.
#   bash ci/h200_triage.sh            # BUDGET_S (default 500) seconds, compiles included
# Plain: any GPU machine with FlashInfer installed (ci/h200_setup.sh). On the project's device
# machine: bash ci/device_runner.sh ci/h200_triage.sh, carry [".gpu"].
# Knobs: PATHS (default fi-decode-xqa,fi-context-fmha-v2,fi-prefill-fa2,fi-decode-wrapper),
# BUDGET_S, SEED, EXTRA (more run flags). Writes triage.log (the report as printed), run.json (the
# report as JSON), groups.tgz (each group's repro files and the run's groups.json).
set -u
name=triage
source "$(dirname "$0")/h200_setup.sh"
PATHS=${PATHS:-fi-decode-xqa,fi-context-fmha-v2,fi-prefill-fa2,fi-decode-wrapper}
BUDGET_S=${BUDGET_S:-500}
step() { echo "== $(date +%T) $*" >>"$log"; }
step "difftest paths"
"$py" -m difftest paths >>"$log" 2>&1
step "difftest run --paths $PATHS --budget-s $BUDGET_S --seed ${SEED:-0} ${EXTRA:-}"
start=$(date +%s)
# shellcheck disable=SC2086
timeout $((BUDGET_S + 60)) "$py" -m difftest run --paths "$PATHS" --budget-s "$BUDGET_S" \
  --seed "${SEED:-0}" --out "$work/run" --json "$out/run.json" ${EXTRA:-} >>"$log" 2>&1
echo "exit $? after $(($(date +%s) - start)) s" >>"$log"
(cd "$work/run" 2>/dev/null && tar czf "$out/groups.tgz" groups groups.json 2>/dev/null)
step "done"
tail -c 11000 "$log"
