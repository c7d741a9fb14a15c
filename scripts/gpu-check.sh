#!/usr/bin/env bash
# Runs on the GPU machine from the kit scripts/gpu-build.sh made: finds the
# CUDA libraries of its python packages, runs the CUDA tests and the kernel
# table, and writes everything to $OUT (default ./gpu-out).
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$kit/gpu-out}"
mkdir -p "$out"
# NVRTC and cuBLAS from the python wheels (the driver's libcuda is on the
# loader path already); must be set before the binaries start.
libs=$(python3 - <<'PY'
import glob, os, site
dirs = set()
for sp in site.getsitepackages():
    for pat in ("nvidia/*/lib", "nvidia/cu13/lib", "nvidia/*/lib64"):
        for d in glob.glob(os.path.join(sp, pat)):
            if glob.glob(os.path.join(d, "libnvrtc.so*")) or glob.glob(os.path.join(d, "libcublas*.so*")):
                dirs.add(d)
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
{
    echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$out/env.txt" 2>&1
cd "$kit"
./fusegrad kernels > "$out/kernels.txt" 2>&1; echo "kernels rc=$?" >> "$out/summary.txt"
for t in kernels cuda_unavailable cuda; do
    timeout 300 "./test-$t" --test-threads=1 --nocapture > "$out/test-$t.txt" 2>&1
    echo "test-$t rc=$?" >> "$out/summary.txt"
done
timeout 300 ./fusegrad bench --device cuda --json > "$out/bench-cuda.json" 2> "$out/bench-cuda.err"
echo "bench rc=$?" >> "$out/summary.txt"
timeout 300 python3 bench_torch_cuda.py --fusegrad "$out/bench-cuda.json" > "$out/bench-torch.txt" 2>&1
echo "torch rc=$?" >> "$out/summary.txt"
cat "$out/summary.txt"
