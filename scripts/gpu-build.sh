#!/usr/bin/env bash
# Builds what the GPU machine runs (it has no Rust toolchain and no
# network) into target/gpu-kit/: the `fusegrad` command and the CUDA test
# binaries (release, stripped, gzipped), scripts/gpu-check.sh, the PyTorch bench,
# and a kernel cache holding every family compiled for sm_90 by NVRTC 13.0,
# the version the GPU machine loads, so nothing compiles there.
# Then: carry target/gpu-kit, run `bash target/gpu-kit/gpu-check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=target/gpu-kit
rm -rf "$kit" && mkdir -p "$kit/cache"
cargo build --release --bin fusegrad
cp target/release/fusegrad "$kit/"
# The test binary gpu-check.sh runs parts of: core::no_gpu:: and the
# device tests (cuda::backend::, cuda::norms::, cuda::bench::).
for t in library; do
    exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' | tail -1)
    cp "$exe" "$kit/test-$t"
done
strip "$kit"/fusegrad "$kit"/test-*
# About a third of their size: gpu-check.sh unpacks them on arrival.
gzip -9 "$kit"/fusegrad "$kit"/test-*
cp scripts/gpu-check.sh scripts/bench_torch_cuda.py "$kit/"
nvrtc13=$(scripts/install-cuda-tools.sh 13)
gunzip -c "$kit/fusegrad.gz" > "$kit/.fusegrad" && chmod +x "$kit/.fusegrad"
FUSEGRAD_NVRTC="$nvrtc13" "$kit/.fusegrad" kernels --arch sm_90 --cache "$kit/cache" | tail -2
rm -f "$kit/.fusegrad"
mib=$(du -sm "$kit" | cut -f1)
echo "kit: $kit, $mib MiB"
if [ "$mib" -gt 48 ]; then
    echo "the kit is over 48 MiB: it would not travel with room to spare" >&2
    exit 1
fi
