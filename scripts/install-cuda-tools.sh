#!/usr/bin/env bash
# Installs NVRTC (and its ptxas) from pinned pip wheels, so that kernels
# compile without a GPU or a CUDA toolkit. Idempotent; no root needed.
# Prints the folder holding the library.
#   scripts/install-cuda-tools.sh      NVRTC 12.9 into target/cuda-tools/ (CI)
#   scripts/install-cuda-tools.sh 13   NVRTC 13.0 into target/cuda-tools-13/,
#                                      the version the GPU machine has
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "13" ]; then
    dest=target/cuda-tools-13
    dir="$dest/nvidia/cu13/lib"
    pkgs=(nvidia-cuda-nvrtc==13.0.88)
else
    dest=target/cuda-tools
    dir="$dest/nvidia/cuda_nvrtc/lib"
    pkgs=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86)
fi
if ! ls "$dir"/libnvrtc.so.1[0-9] > /dev/null 2>&1; then
    mkdir -p "$dest"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$dest" "${pkgs[@]}"
fi
echo "$PWD/$dir"
