#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain): the CUDA
# test binaries and the `fusegrad` command, in release, stripped, with
# scripts/gpu-check.sh, into target/gpu-kit/ (ignored; tens of MiB).
# Then on the GPU machine: `bash target/gpu-kit/gpu-check.sh` (writes $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
kit=target/gpu-kit
rm -rf "$kit" && mkdir -p "$kit"
cargo build --release --bin fusegrad
cp target/release/fusegrad "$kit/"
for t in cuda cuda_norms cuda_unavailable; do
    exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' | tail -1)
    cp "$exe" "$kit/test-$t"
done
strip "$kit"/fusegrad "$kit"/test-*
cp scripts/gpu-check.sh scripts/bench_torch_cuda.py "$kit/"
du -sh "$kit"
