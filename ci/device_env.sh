# Sourced by ci/device_runner.sh, from the checkout root, when the checkout has no .gpu/env.sh:
# a copy of what the workplace's env.sh (staged into .gpu/ by ../shared/gpu/stage.sh) does, so
# that the wrapper does not depend on a file outside this repository.
#  - installs the FlashInfer wheels and kits staged in .gpu/ (if any) into a fresh site
#    directory at the front of PYTHONPATH (the device machine has no FlashInfer and no network);
#  - sets FlashInfer's JIT variables for the H200 (SM90: 9.0a; no downloads, so the TRT-LLM-gen
#    paths, which need Blackwell and downloaded kernels, fail at once; 16 ninja jobs);
#  - installs this checkout in editable mode without network (the pytest plugin's entry point,
#    `ci/gate`), when there is a pyproject.toml;
#  - prints the GPU, torch and FlashInfer versions, and fails when FlashInfer is not importable.
GPU_SITE=$HOME/.difftest-gpu-site
shopt -s nullglob
staged=(.gpu/*.whl .gpu/flashinfer-*.tar.xz)
shopt -u nullglob
if [ ${#staged[@]} -gt 0 ]; then
  rm -rf "$GPU_SITE" && mkdir -p "$GPU_SITE"
  for file in "${staged[@]}"; do
    case $file in
    *.whl) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$GPU_SITE" "$file" || return 1 ;;
    *) xz -dc "$file" | tar x -C "$GPU_SITE" || return 1 ;;
    esac
  done
  export PYTHONPATH=$GPU_SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_NO_DOWNLOAD=1 MAX_JOBS=16
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$HOME}
if [ -f pyproject.toml ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$HOME/.difftest-gpu-install.log" 2>&1 \
    || { echo "editable install failed:"; tail -5 "$HOME/.difftest-gpu-install.log"; }
fi
python3 -c "import torch, flashinfer; print('gpu:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none', '| torch', torch.__version__, '| flashinfer', flashinfer.__version__)"
