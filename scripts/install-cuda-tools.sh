#!/usr/bin/env bash
# Installs NVRTC (and its ptxas) from pinned pip wheels into
# target/cuda-tools/, so that CI compiles every kernel without a GPU or a
# CUDA toolkit. Idempotent; no root needed. Prints where the library is.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/cuda-tools
lib="$dest/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
if [ ! -e "$lib" ]; then
    mkdir -p "$dest"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
        --target "$dest" \
        nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-nvcc-cu12==12.9.86
fi
echo "$PWD/$lib"
