# Sourced by the ci/h200_*.sh scripts, with $name set (their log is $out/$name.log). Plain: on
# any GPU machine with torch and FlashInfer installed, from any directory; no staged kit, no
# device conventions (ci/device_runner.sh adds those). It sets:
#   root  the checkout (the script's parent folder); the script continues there
#   out   where logs and JSON go: DIFFTEST_GPU_OUT (relative to where you ran the script), or
#         difftest-out/gpu in the checkout (ignored by git)
#   log   $out/$name.log, begun with the GPU, torch and FlashInfer versions
#   py    the interpreter: PYTHON, or python3 from PATH (the one torch and FlashInfer are in)
#   work  a fresh scratch folder (mktemp -d) for the runs' own output
#   PRESETS  the model presets, unless set
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${DIFFTEST_GPU_OUT:-$root/difftest-out/gpu}
mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "cannot create output folder $out"; exit 1; }
cd "$root" || exit 1
log=$out/$name.log
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/difftest-gpu.XXXXXX") || exit 1
PRESETS=${PRESETS:-llama-3.1-8b,qwen3.5-397b-a17b,gpt-oss-120b,llama-3.3-70b,qwen3-next-80b}
{
  echo "== $(date +%T) $name: checkout $root, output $out, scratch $work"
  "$py" - <<'PY'
import torch

try:
    import flashinfer

    fi = flashinfer.__version__
except Exception as e:  # the FlashInfer paths then report it as unavailable
    fi = f"not importable ({type(e).__name__}: {e})"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"gpu: {gpu} | torch {torch.__version__} | flashinfer {fi}")
PY
} >"$log" 2>&1
