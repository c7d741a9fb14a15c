#!/usr/bin/env bash
# The GPU check, run from the kit scripts/gpu-build.sh makes: the kernel
# table from the kit's cache, the CUDA tests, the CUDA bench beside
# PyTorch's, and compute-sanitizer. Writes at most six files to $OUT
# (default: the kit's gpu-out/): summary.md, bench.jsonl, torch.jsonl,
# tests.log, sanitizer.log, kernels.txt. summary.md is rewritten after every
# step, so a run cut short still says how far it got.
#
#   bash target/gpu-kit/gpu-check.sh             on the GPU machine
#   bash target/gpu-kit/gpu-check.sh --emulate   here, on the CPU emulation
#                                                (small shapes, test subsets)
#
# Each step has a timeout; their sum (STEP_LIMITS) stays under 8 minutes.
# Exit status: 0 when every step passed, 1 otherwise, 2 without a GPU.
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$kit/gpu-out}"
emulate=0
[ "${1:-}" = "--emulate" ] && emulate=1
mkdir -p "$out"
cd "$kit"
# gpu-build.sh ships the binaries gzipped (the kit travels under a size
# limit); unpacked once, in place.
for z in ./*.gz; do
    [ -e "$z" ] || continue
    gunzip -f "$z" 2> /dev/null ||
        python3 -c 'import gzip,shutil,sys,os; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[1][:-3], "wb")); os.remove(sys.argv[1])' "$z"
    chmod +x "${z%.gz}"
done
summary="$out/summary.md"
# Scratch files stay outside $OUT, so a run cut short leaves only its six.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
steps="$scratch/steps"
: > "$steps"
: > "$out/tests.log"
: > "$out/sanitizer.log"
export FUSEGRAD_CACHE_DIR="${FUSEGRAD_CACHE_DIR:-$kit/cache}"
export FUSEGRAD_REQUIRE_GPU=1
export RUST_BACKTRACE=0

if [ "$emulate" = 1 ]; then
    # The repository's emulated driver and NVRTC, as a real machine has
    # its driver and NVRTC: found through the loader path.
    root="${FUSEGRAD_ROOT:-$(cd "$kit/../.." && pwd)}"
    python3 "$root/scripts/build-cuda-emu.py" > /dev/null || exit 1
    export LD_LIBRARY_PATH="$root/target/cuda-emu:${LD_LIBRARY_PATH:-}"
    export FUSEGRAD_NVRTC="${FUSEGRAD_NVRTC:-$root/target/cuda-tools/nvidia/cuda_nvrtc/lib}"
    bench_args=(--shapes 64x256,33x1000 --reps 3)
    cuda_filter=(cuda::backend::fused_and_composed_layer_norm_agree_on_the_gpu)
    norms_filter=(cuda::norms::fused_cuda_composed_cuda_and_fused_cpu_agree_f32)
    where="CPU emulation of the driver (tests/cuda_emu)"
else
    if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
        echo "no GPU here (nvidia-smi finds none): nothing checked; run this on the GPU machine, or with --emulate" | tee "$summary"
        exit 2
    fi
    # NVRTC and cuBLAS from the python packages (the driver's libcuda is on
    # the loader path already); set before any binary starts.
    libs=$(python3 - <<'PY'
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    for pat in ("nvidia/cu13/lib", "nvidia/*/lib", "nvidia/*/lib64"):
        for d in sorted(glob.glob(os.path.join(sp, pat))):
            has = lambda p: glob.glob(os.path.join(d, p))
            if (has("libnvrtc.so*") or has("libcublas*.so*")) and d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
    export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
    for d in ${libs//:/ }; do
        if [ -z "${FUSEGRAD_NVRTC:-}" ] && ls "$d"/libnvrtc.so.1[0-9] > /dev/null 2>&1; then
            export FUSEGRAD_NVRTC="$d"
        fi
    done
    bench_args=()
    cuda_filter=(cuda::backend::)
    norms_filter=(cuda::norms::)
    where="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
fi

# Step name, then its time limit in seconds; the sum is the run's bound.
STEP_LIMITS="kernels:45 tests-unavailable:15 tests-cuda:100 tests-norms:60 tests-bench:20 bench:110 torch:60 memcheck:35 racecheck:25"
# The emulation runs kernels on two CPU cores and may compile on a cold
# cache: the same steps, with room for that.
[ "$emulate" = 1 ] && STEP_LIMITS="kernels:400 tests-unavailable:60 tests-cuda:200 tests-norms:150 tests-bench:150 bench:200 torch:60 memcheck:1 racecheck:1"
limit() { local kv; for kv in $STEP_LIMITS; do [ "${kv%%:*}" = "$1" ] && echo "${kv#*:}"; done; }
total_limit=0
for kv in $STEP_LIMITS; do total_limit=$((total_limit + ${kv#*:})); done

write_summary() {
    {
        echo "# GPU check ($( [ "$emulate" = 1 ] && echo emulated || echo real ))"
        echo
        echo "- when: $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "- device: $where"
        echo "- NVRTC: $(grep -m1 '^NVRTC' "$out/kernels.txt" 2> /dev/null || echo 'not yet known')"
        echo "- kernel cache: $FUSEGRAD_CACHE_DIR"
        local first
        first=$(sed -n 's/.*"first_result_ms":\([0-9.]*\),"compiled":\([0-9]*\),"compile_s":\([0-9.]*\),"loaded":\([0-9]*\).*/\1 ms to the first result; \2 families compiled (\3 s), \4 read from the cache/p' "$out/bench.jsonl" 2> /dev/null | head -1)
        echo "- first launch: ${first:-not measured yet}"
        echo "- step limits: $total_limit s in all"
        echo
        echo "| step | limit s | took s | result |"
        echo "|---|---|---|---|"
        cat "$steps"
        echo
        echo "## Tests"
        echo
        local passed failed
        passed=$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed' "$out/tests.log" | awk '{s += $4} END {print s + 0}')
        failed=$(grep -o '[0-9]* failed;' "$out/tests.log" | awk '{s += $1} END {print s + 0}')
        echo "$passed passed, $failed failed (tests.log)"
        grep -E '^test .* FAILED$|panicked at' "$out/tests.log" | head -20 | sed 's/^/    /'
        echo
        echo "## Bench"
        echo
        if [ -s "$scratch/table.md" ]; then
            cat "$scratch/table.md"
        elif [ -s "$out/bench.jsonl" ]; then
            python3 "$kit/bench_torch_cuda.py" --table-only --fusegrad "$out/bench.jsonl" 2> /dev/null ||
                echo "(bench.jsonl could not be read as a table)"
        else
            echo "(no bench rows)"
        fi
        echo
        echo "## Sanitizer"
        echo
        grep -E '^(memcheck|racecheck):' "$scratch/sanitizer" 2> /dev/null || echo "(not run yet)"
    } > "$summary"
}

# step NAME LOG CMD...: runs CMD under NAME's limit, appending to LOG, and
# records the result in the summary.
step() {
    local name=$1 log=$2 lim t0 rc took result
    shift 2
    lim=$(limit "$name")
    t0=$(date +%s%N)
    echo "== $name: $* (limit ${lim}s)" >> "$log"
    timeout "$lim" "$@" >> "$log" 2>&1
    rc=$?
    took=$((($(date +%s%N) - t0) / 1000000))
    case $rc in
        0) result="ok" ;;
        124 | 137) result="TIMEOUT" ;;
        *) result="FAILED (exit $rc)" ;;
    esac
    printf '| %s | %s | %d.%d | %s |\n' "$name" "$lim" $((took / 1000)) $((took % 1000 / 100)) "$result" >> "$steps"
    write_summary
    return $rc
}

# A step that cannot run here still gets its row.
skip() {
    printf '| %s | %s | 0 | skipped: %s |\n' "$1" "$(limit "$1")" "$2" >> "$steps"
    write_summary
}

# Binaries missing from the kit are a failed step, not a silent pass.
run_test() {
    local name=$1 bin=$2
    shift 2
    if [ -x "$bin" ]; then
        step "$name" "$out/tests.log" "$bin" --test-threads=1 "$@"
    else
        printf '| %s | %s | 0 | FAILED (%s not in the kit) |\n' "$name" "$(limit "$name")" "$bin" >> "$steps"
        write_summary
    fi
}

write_summary
step kernels "$out/kernels.txt" ./fusegrad kernels --arch sm_90
run_test tests-unavailable ./test-library core::no_gpu::
run_test tests-cuda ./test-library "${cuda_filter[@]}"
run_test tests-norms ./test-library "${norms_filter[@]}"
run_test tests-bench ./test-library cuda::bench::
: > "$out/bench.jsonl"
step bench "$out/bench.jsonl" ./fusegrad bench --device cuda --json "${bench_args[@]}"
# The step's own header line is not JSON; keep the rows only.
grep '^{' "$out/bench.jsonl" > "$scratch/rows" ; mv "$scratch/rows" "$out/bench.jsonl"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1; then
    : > "$out/torch.jsonl"
    step torch "$out/torch.jsonl" python3 bench_torch_cuda.py --fusegrad "$out/bench.jsonl" --table "$scratch/table.md"
    grep '^{' "$out/torch.jsonl" > "$scratch/rows" ; mv "$scratch/rows" "$out/torch.jsonl"
else
    echo '{"skipped":"no PyTorch with CUDA on this machine"}' > "$out/torch.jsonl"
    skip torch "no PyTorch with CUDA on this machine"
fi

# compute-sanitizer: its own failures ("Device not supported", error 999)
# are reported as unusable, not as memory errors.
: > "$scratch/sanitizer"
sanitize() {
    local tool=$1
    shift
    if ! command -v compute-sanitizer > /dev/null; then
        echo "$tool: not on this host" >> "$scratch/sanitizer"
        skip "$tool" "compute-sanitizer not on this host"
        return
    fi
    local before
    before=$(wc -l < "$out/sanitizer.log")
    step "$tool" "$out/sanitizer.log" compute-sanitizer --tool "$tool" "$@"
    local part
    part=$(tail -n +"$((before + 1))" "$out/sanitizer.log")
    if echo "$part" | grep -q 'ERROR SUMMARY: 0 errors'; then
        echo "$tool: no errors" >> "$scratch/sanitizer"
    elif n=$(echo "$part" | grep -o 'ERROR SUMMARY: [0-9]* error' | grep -o '[0-9]*' | tail -1) && [ -n "$n" ]; then
        echo "$tool: $n errors found (sanitizer.log)" >> "$scratch/sanitizer"
    else
        echo "$tool: sanitizer unusable here: $(echo "$part" | grep -m1 -iE 'error|not supported|unable' || echo "$part" | tail -1)" >> "$scratch/sanitizer"
    fi
    write_summary
}
if [ "$emulate" = 1 ]; then
    echo "memcheck: not run on the emulation" >> "$scratch/sanitizer"
    echo "racecheck: not run on the emulation" >> "$scratch/sanitizer"
    skip memcheck "no sanitizer on the emulation"
    skip racecheck "no sanitizer on the emulation"
else
    sanitize memcheck ./test-library --test-threads=1 cuda::backend::every_op_matches_the_cpu_f32
    sanitize racecheck ./test-library --test-threads=1 cuda::backend::fused_and_composed
fi
write_summary
echo
cat "$summary"
grep -qE '\| (FAILED|TIMEOUT)' "$summary" && exit 1
exit 0
