# Sourced by ci/h200_campaign.sh and ci/h200_build_modules.sh on the device, with $log set:
# FlashInfer's JIT cache in the checkout's ignored .jit-cache/, the GPU environment
# (.gpu/env.sh), the modules kept in .gpu-modules/, and the presets (PRESETS overrides them).
export FLASHINFER_WORKSPACE_BASE=$PWD/.jit-cache
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
source .gpu/env.sh >"$log" 2>&1
bash ci/gpu_modules.sh restore >>"$log" 2>&1
PRESETS=${PRESETS:-llama-3.1-8b,qwen3.5-397b-a17b,gpt-oss-120b,llama-3.3-70b,qwen3-next-80b}
