#!/usr/bin/env bash
# Runs on the GPU machine from the kit scripts/gpu-build.sh made: finds the
# CUDA libraries of its python packages, runs the CUDA tests and the kernel
# table, and writes everything to $OUT (default ./gpu-out).
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$kit/gpu-out}"
mkdir -p "$out"
cd "$kit"
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
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "no GPU here (nvidia-smi finds none): nothing to check; run this on the GPU machine" | tee "$out/summary.txt"
    ./fusegrad kernels > "$out/kernels.txt" 2>&1 || true
    exit 0
fi
# A GPU is here: a CUDA test that cannot reach it fails instead of skipping.
export FUSEGRAD_REQUIRE_GPU=1
{
    echo "# GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$out/env.txt" 2>&1
# Each step has a timeout; together they stay under 8 minutes (470 s).
timeout 15 ./test-cuda_unavailable --test-threads=1 --nocapture > "$out/test-cuda_unavailable.txt" 2>&1
echo "test-cuda_unavailable rc=$?" >> "$out/summary.txt"
timeout 100 ./test-cuda --test-threads=1 --nocapture > "$out/test-cuda.txt" 2>&1
echo "test-cuda rc=$?" >> "$out/summary.txt"
timeout 80 ./test-cuda_norms --test-threads=1 --nocapture > "$out/test-cuda_norms.txt" 2>&1
echo "test-cuda_norms rc=$?" >> "$out/summary.txt"
timeout 90 ./fusegrad bench --device cuda --json > "$out/bench-cuda.json" 2> "$out/bench-cuda.err"
echo "bench rc=$?" >> "$out/summary.txt"
timeout 70 python3 bench_torch_cuda.py --fusegrad "$out/bench-cuda.json" > "$out/bench-torch.txt" 2>&1
echo "torch rc=$?" >> "$out/summary.txt"
# Memory errors and shared-memory races, where the host has the sanitizer.
if command -v compute-sanitizer > /dev/null; then
    timeout 40 compute-sanitizer --tool memcheck ./test-cuda --test-threads=1 every_op_matches_the_cpu_f32 > "$out/memcheck.txt" 2>&1
    echo "memcheck rc=$?" >> "$out/summary.txt"
    timeout 25 compute-sanitizer --tool racecheck ./test-cuda --test-threads=1 fused_and_composed > "$out/racecheck.txt" 2>&1
    echo "racecheck rc=$?" >> "$out/summary.txt"
else
    echo "compute-sanitizer: not on this host, skipped" >> "$out/summary.txt"
fi
# Last: CI prints this table from the same compiler already.
timeout 50 ./fusegrad kernels > "$out/kernels.txt" 2>&1; echo "kernels rc=$?" >> "$out/summary.txt"
echo; echo "== summary =="
cat "$out/summary.txt"
