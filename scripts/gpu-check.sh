#!/usr/bin/env bash
# The GPU check, run from the kit scripts/gpu-build.sh makes: the kernels
# loaded on the device from the kit's cache, the CUDA tests, the CUDA bench
# beside PyTorch's, and compute-sanitizer. Writes at most seven files to
# $OUT (default: the kit's gpu-out/): summary.md, bench.jsonl, torch.jsonl,
# tests.log, sanitizer.log, kernels.txt (and rerun.log with --rerun).
# summary.md is rewritten after every step, so a run cut short still says
# how far it got.
#
#   bash target/gpu-kit/gpu-check.sh                  on the GPU machine
#   bash target/gpu-kit/gpu-check.sh --preflight      what is there, in seconds
#   bash target/gpu-kit/gpu-check.sh --rerun GROUP    one step again, full output
#   bash target/gpu-kit/gpu-check.sh --emulate [...]  here, on the CPU emulation
#   bash target/gpu-kit/gpu-check.sh --limits         the time limits' totals
#
# Every step runs under `timeout -k 10`, the untimed set-up too; a mode's
# limits, with 10 s per step to kill one that ignores SIGTERM, add up to
# at most 480 s (the script refuses to run otherwise). GPU_CHECK_LIMITS
# ("step:seconds ...") lowers limits for a rehearsal.
# Exit status: 0 when every step passed, 1 otherwise, 2 without a GPU.
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$kit/gpu-out}"
emulate=0 mode=run rerun=""
while [ $# -gt 0 ]; do
    case $1 in
        --emulate) emulate=1 ;;
        --preflight) mode=preflight ;;
        --limits) mode=limits ;;
        --rerun) mode=rerun rerun=${2:-} && shift ;;
        *) echo "gpu-check.sh: unknown argument $1" >&2 && exit 1 ;;
    esac
    shift
done

KILL_GRACE=10
BUDGET=480
# Step name, then its limit in seconds. The emulation runs kernels on two
# CPU cores with small shapes and one test per group.
REAL_LIMITS="unpack:10 preflight:10 kernels:25 tests-unavailable:15 tests-cuda:75 tests-norms:45 tests-bench:15 bench:70 torch:40 memcheck:40 racecheck:25"
EMU_LIMITS="unpack:10 preflight:10 kernels:30 tests-unavailable:40 tests-cuda:60 tests-norms:60 tests-bench:50 bench:60 torch:10 memcheck:15 racecheck:15"
RERUN_LIMIT=100
total_of() { local kv t=0 n=0; for kv in $1; do t=$((t + ${kv#*:} + KILL_GRACE)); n=$((n + 1)); done; echo "$t $n"; }
if [ "$mode" = limits ]; then
    read -r r rn <<< "$(total_of "$REAL_LIMITS")"
    read -r e en <<< "$(total_of "$EMU_LIMITS")"
    echo "real: $r s in all ($rn steps, each with ${KILL_GRACE} s to be killed)"
    echo "emulate: $e s in all ($en steps, each with ${KILL_GRACE} s to be killed)"
    echo "rerun: $((RERUN_LIMIT + KILL_GRACE)) s"
    echo "budget: $BUDGET s"
    exit 0
fi
LIMITS=$REAL_LIMITS
[ "$emulate" = 1 ] && LIMITS=$EMU_LIMITS
limit() {
    local kv v=""
    for kv in $LIMITS; do [ "${kv%%:*}" = "$1" ] && v=${kv#*:}; done
    for kv in ${GPU_CHECK_LIMITS:-}; do
        [ "${kv%%:*}" = "$1" ] && [ "${kv#*:}" -lt "${v:-0}" ] && v=${kv#*:}
    done
    echo "${v:-$RERUN_LIMIT}"
}
read -r total_limit nsteps <<< "$(total_of "$LIMITS")"
if [ "$total_limit" -gt "$BUDGET" ]; then
    echo "gpu-check.sh: the limits add up to $total_limit s, over the $BUDGET s budget" >&2
    exit 1
fi

mkdir -p "$out"
cd "$kit" || exit 1
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# LD_LIBRARY_PATH gains each folder once, and never an empty entry (one
# would make the loader search the current folder).
ld_clean() { echo "$1" | tr -s ':' | sed 's/^://; s/:$//'; }
LD_LIBRARY_PATH=$(ld_clean "${LD_LIBRARY_PATH:-}")
ld_prepend() {
    local d
    for d in "$@"; do
        [ -n "$d" ] && [ -d "$d" ] || continue
        case ":$LD_LIBRARY_PATH:" in *":$d:"*) continue ;; esac
        LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    export LD_LIBRARY_PATH
}
# compute-sanitizer and nvcc live in the toolkit's bin/.
[ -d /usr/local/cuda/bin ] && PATH="$PATH:/usr/local/cuda/bin"

export FUSEGRAD_CACHE_DIR="${FUSEGRAD_CACHE_DIR:-$kit/cache}"
export FUSEGRAD_REQUIRE_GPU=1
export RUST_BACKTRACE=0

# gpu-build.sh ships the binaries gzipped (the kit travels under a size
# limit); unpacked once, in place, under the unpack limit.
unpack() {
    local z
    for z in ./*.gz; do
        [ -e "$z" ] || continue
        gunzip -f "$z" 2> /dev/null ||
            python3 -c 'import gzip,shutil,sys,os; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[1][:-3], "wb")); os.remove(sys.argv[1])' "$z" ||
            return 1
        chmod +x "${z%.gz}"
    done
}
t0=$(date +%s)
export -f unpack
timeout -k "$KILL_GRACE" "$(limit unpack)" bash -c unpack
unpack_rc=$?
unpack_took=$(($(date +%s) - t0))

if [ "$emulate" = 1 ]; then
    # The repository's emulated driver and cuBLAS, as a real machine has
    # its own: found through the loader path.
    root="${FUSEGRAD_ROOT:-$(cd "$kit/../.." && pwd)}"
    timeout -k "$KILL_GRACE" 60 python3 "$root/scripts/build-cuda-emu.py" > /dev/null || exit 1
    ld_prepend "$root/target/cuda-emu"
    # shellcheck disable=SC2054 # one argument: the shapes list
    bench_args=(--shapes 16x256,5x1000 --reps 2)
    where="CPU emulation of the driver (tests/cuda_emu)"
    card=""
else
    if ! command -v nvidia-smi > /dev/null || ! timeout -k 5 10 nvidia-smi -L > /dev/null 2>&1; then
        echo "no GPU here (nvidia-smi finds none): nothing checked; run this on the GPU machine, or with --emulate" | tee "$out/summary.md"
        exit 2
    fi
    # cuBLAS and NVRTC from the python packages and the toolkit (the
    # driver's libcuda is on the loader path already); set before any
    # binary starts.
    libs=$(timeout -k 2 8 python3 - << 'PY'
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    for pat in ("nvidia/cu13/lib", "nvidia/*/lib", "nvidia/*/lib64"):
        for d in sorted(glob.glob(os.path.join(sp, pat))):
            has = lambda p: glob.glob(os.path.join(d, p))
            if (has("libnvrtc.so*") or has("libcublas*.so*")) and d not in dirs:
                dirs.append(d)
print(" ".join(dirs))
PY
    )
    # shellcheck disable=SC2086 # folders without spaces, one word each
    ld_prepend /usr/local/cuda/lib64 $libs
    bench_args=()
    where="$(timeout -k 5 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
    # The card's model, lower case: "NVIDIA H100 80GB HBM3" -> h100.
    card=$(echo "$where" | sed -E 's/^NVIDIA //; s/[ ,].*//' | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9-')
fi
# An empty LD_LIBRARY_PATH is left unset rather than exported empty.
if [ -n "$LD_LIBRARY_PATH" ]; then export LD_LIBRARY_PATH; else unset LD_LIBRARY_PATH; fi

# The test groups: name, then the filters of the `library` test binary.
# Racecheck takes only the kernels that use shared memory (the norms, the
# block reductions and softmax); memcheck every op once in f32.
declare -A GROUP
if [ "$emulate" = 1 ]; then
    GROUP[tests-unavailable]="core::no_gpu::"
    GROUP[tests-cuda]="cuda::backend::fused_and_composed_layer_norm_agree_on_the_gpu"
    GROUP[tests-norms]="cuda::norms::fused_cuda_composed_cuda_and_fused_cpu_agree_f32"
    GROUP[tests-bench]="cuda::bench::"
else
    GROUP[tests-unavailable]="core::no_gpu::"
    GROUP[tests-cuda]="cuda::backend:: cuda::cache:: --skip without_nvrtc_a_full_cache"
    GROUP[tests-norms]="cuda::norms::"
    GROUP[tests-bench]="cuda::bench::"
fi
GROUP[memcheck]="--test-threads=1 cuda::backend::every_op_matches_the_cpu_f32"
GROUP[racecheck]="--test-threads=1 cuda::norms::fused_cuda_composed_cuda_and_fused_cpu_agree_f32"

# What is here, in a few seconds: the lines `fusegrad devices` prints, the
# GPU by nvidia-smi, compute-sanitizer, torch, the loader path.
preflight() {
    local torch_out="$scratch/torch-version"
    (timeout -k 2 8 python3 -c 'import torch; print(torch.__version__, "CUDA" if torch.cuda.is_available() else "no CUDA")' > "$torch_out" 2> /dev/null ||
        echo "not importable (missing, broken, or over 8 s)" > "$torch_out") &
    local tp=$!
    echo "- GPU (nvidia-smi): $where"
    if [ -x ./fusegrad ]; then
        timeout -k 2 8 ./fusegrad devices 2>&1 | sed 's/^/- /'
    else
        echo "- fusegrad: not in the kit (or not unpacked)"
    fi
    echo "- compute-sanitizer: $(command -v compute-sanitizer || echo 'not found (PATH and /usr/local/cuda/bin)')"
    wait "$tp"
    echo "- torch: $(cat "$torch_out")"
    echo "- loader path: ${LD_LIBRARY_PATH:-(empty)}"
}

export where scratch
export -f preflight
if [ "$mode" = preflight ]; then
    timeout -k 2 "$(limit preflight)" bash -c preflight
    exit 0
fi

steps="$scratch/steps"
: > "$steps"
: > "$scratch/counts"
: > "$scratch/sanitizer"
: > "$scratch/failed-groups"
summary="$out/summary.md"
if [ "$mode" = run ]; then
    : > "$out/tests.log"
    : > "$out/sanitizer.log"
    : > "$out/kernels.txt"
fi
printf '| unpack | %s | %d | %s |\n' "$(limit unpack)" "$unpack_took" \
    "$([ $unpack_rc = 0 ] && echo ok || echo "FAILED (exit $unpack_rc)")" >> "$steps"
t0=$(date +%s)
timeout -k 2 "$(limit preflight)" bash -c preflight > "$scratch/preflight" 2>&1
pf_rc=$?
printf '| preflight | %s | %d | %s |\n' "$(limit preflight)" $(($(date +%s) - t0)) \
    "$([ $pf_rc = 0 ] && echo ok || echo "FAILED (exit $pf_rc)")" >> "$steps"

# The first lines a reader needs: the limits, and whether the kit's
# kernels match this machine's NVRTC.
nvrtc_note() {
    local c
    c=$(grep -m1 '^- kernel cache:' "$scratch/preflight")
    case $c in
        *"they match this NVRTC"*) echo "the kit's kernels match this machine's NVRTC" ;;
        *"this NVRTC is"*) echo "NVRTC DIFFERS: ${c#*: }" ;;
        *"no NVRTC here"*) echo "no NVRTC on this machine: the kit's kernels run without it; ${c#*: }" ;;
        *) echo "${c:-the kernel cache was not read}" ;;
    esac
}

write_summary() {
    {
        echo "# GPU check ($([ "$emulate" = 1 ] && echo emulated || echo real)$([ "$mode" = rerun ] && echo ", rerun of $rerun"))"
        echo
        echo "- time limits: $total_limit s in all ($nsteps steps, each limit plus ${KILL_GRACE} s to kill it), at most $BUDGET"
        echo "- NVRTC: $(nvrtc_note)"
        echo "- device: $where"
        if [ -n "$card" ]; then
            echo "- keep as: docs/gpu-report-$card.md"
        else
            echo "- keep as: (an emulated run is not kept)"
        fi
        echo "- when: $(date -u +%Y-%m-%dT%H:%MZ)"
        local first
        first=$(sed -n 's/.*"first_result_ms":\([0-9.]*\),"compiled":\([0-9]*\),"compile_s":\([0-9.]*\),"loaded":\([0-9]*\).*/\1 ms to the first result; \2 families compiled (\3 s), \4 read from the cache/p' "$out/bench.jsonl" 2> /dev/null | head -1)
        echo "- first launch: ${first:-not measured yet}"
        echo
        echo "## Preflight"
        echo
        cat "$scratch/preflight"
        grep -m1 '^kernels:' "$out/kernels.txt" 2> /dev/null | sed 's/^/- /'
        echo
        echo "| step | limit s | took s | result |"
        echo "|---|---|---|---|"
        cat "$steps"
        echo
        echo "## Tests"
        echo
        if [ -s "$scratch/counts" ]; then cat "$scratch/counts"; else echo "(no test group run yet)"; fi
        echo
        echo "## Bench"
        echo
        if [ -s "$scratch/table.md" ]; then
            cat "$scratch/table.md"
        elif [ -s "$out/bench.jsonl" ]; then
            timeout -k 2 10 python3 "$kit/bench_torch_cuda.py" --table-only --fusegrad "$out/bench.jsonl" 2> /dev/null ||
                echo "(bench.jsonl could not be read as a table)"
        else
            echo "(no bench rows)"
        fi
        echo
        echo "## Sanitizer"
        echo
        if [ -s "$scratch/sanitizer" ]; then cat "$scratch/sanitizer"; else echo "(not run yet)"; fi
        if [ -s "$scratch/failed-groups" ]; then
            echo
            echo "## Follow-up"
            echo
            echo "On the same warm machine, within 120 s, each failed group again with its full output:"
            echo
            sed 's/^/    bash target\/gpu-kit\/gpu-check.sh --rerun /' "$scratch/failed-groups"
        fi
    } > "$summary"
}

# step NAME LOG CMD...: runs CMD under NAME's limit (and -k), appending to
# LOG; records the result in the summary; returns CMD's status.
step() {
    local name=$1 log=$2 lim t0 rc took result
    shift 2
    lim=$(limit "$name")
    t0=$(date +%s%N)
    echo "== $name: $* (limit ${lim}s)" >> "$log"
    timeout -k "$KILL_GRACE" "$lim" "$@" >> "$log" 2>&1
    rc=$?
    took=$((($(date +%s%N) - t0) / 1000000))
    case $rc in
        0) result="ok" ;;
        124 | 137) result="FAILED (timed out after $lim s)" ;;
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

# The runner's own closing line of LOG, and the failures it lists: the
# last `test result:` line and the `failures:` block before it, so quoted
# output of child processes is never counted.
counts() {
    local name=$1 log=$2 closing
    closing=$(grep -E '^test result: ' "$log" | tail -1)
    if [ -z "$closing" ]; then
        echo "- $name: no closing line from the test runner (cut short)" >> "$scratch/counts"
        return
    fi
    echo "- $name: ${closing#test result: }" >> "$scratch/counts"
    awk '/^failures:$/ {n = 0; delete f; inb = 1; next}
         inb && /^    / {f[n++] = $0; next}
         inb && /^$/ && n > 0 {inb = 0}
         END {for (i = 0; i < n && i < 20; i++) print "    " f[i]}' "$log" >> "$scratch/counts"
}

# A test group of the `library` binary; a binary missing from the kit is a
# failed step, not a silent pass.
run_test() {
    local name=$1 log=$2
    shift 2
    if [ ! -x ./test-library ]; then
        printf '| %s | %s | 0 | FAILED (test-library not in the kit) |\n' "$name" "$(limit "$name")" >> "$steps"
        echo "$name" >> "$scratch/failed-groups"
        write_summary
        return 1
    fi
    local part="$scratch/$name.log"
    # shellcheck disable=SC2086 # the group's filters are words
    step "$name" "$part" ./test-library ${GROUP[$name]} "$@"
    local rc=$?
    [ $rc != 0 ] && echo "$name" >> "$scratch/failed-groups"
    cat "$part" >> "$log"
    counts "$name" "$part"
    write_summary
    return $rc
}

# compute-sanitizer over a test group: a finding fails the step (exit 9)
# and is quoted; a timeout says so; a sanitizer that refuses this machine
# (gVisor's "Device not supported", error 999) is "unusable", not a finding.
sanitize() {
    local tool=$1 log=$2
    if ! command -v compute-sanitizer > /dev/null; then
        echo "- $tool: not run: compute-sanitizer not found (PATH and /usr/local/cuda/bin)" >> "$scratch/sanitizer"
        skip "$tool" "compute-sanitizer not found"
        return 0
    fi
    local part="$scratch/$tool.log" rc lim
    lim=$(limit "$tool")
    # shellcheck disable=SC2086 # the group's filters are words
    step "$tool" "$part" compute-sanitizer --tool "$tool" --error-exitcode 9 ./test-library ${GROUP[$tool]}
    rc=$?
    [ $rc != 0 ] && echo "$tool" >> "$scratch/failed-groups"
    cat "$part" >> "$log"
    local finding
    finding=$(grep -E '^========= +[A-Za-z]' "$part" | grep -vE 'COMPUTE-SANITIZER|ERROR SUMMARY|^========= +(at|by|Saved|Address|Host|Program|Device Frame|Target)' | head -1 | sed 's/^========= *//')
    case $rc in
        0) echo "- $tool: no errors ($(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$part" | tail -1))" >> "$scratch/sanitizer" ;;
        9) echo "- $tool: FINDINGS ($(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$part" | tail -1 || echo 'no summary line')); the first: \"${finding:-see sanitizer.log}\"" >> "$scratch/sanitizer" ;;
        124 | 137) echo "- $tool: timed out after $lim s" >> "$scratch/sanitizer" ;;
        *)
            if grep -qiE 'device not supported|error 999|unable to (initialize|load)' "$part"; then
                local why
                why=$(grep -m1 -iE 'device not supported|error 999|unable to (initialize|load)' "$part")
                echo "- $tool: sanitizer unusable here: $why" >> "$scratch/sanitizer"
                # Its row says unusable: nothing was checked, nothing found.
                sed -i "s/^| $tool | \([0-9]*\) | \([0-9.]*\) | FAILED (exit $rc) |\$/| $tool | \1 | \2 | unusable: the sanitizer refused this machine |/" "$steps"
                sed -i "/^$tool\$/d" "$scratch/failed-groups"
            else
                echo "- $tool: a test failed under the sanitizer (exit $rc): $(grep -E '^test result:|panicked at' "$part" | tail -1)" >> "$scratch/sanitizer"
            fi
            ;;
    esac
    write_summary
}

# One group again with full output (the follow-up command).
if [ "$mode" = rerun ]; then
    LIMITS="$rerun:$RERUN_LIMIT"
    total_limit=$((RERUN_LIMIT + KILL_GRACE)) nsteps=1
    case $rerun in
        memcheck | racecheck) sanitize "$rerun" "$out/rerun.log" ;;
        tests-*)
            [ -n "${GROUP[$rerun]:-}" ] || { echo "unknown group $rerun" >&2; exit 1; }
            : > "$out/rerun.log"
            run_test "$rerun" "$out/rerun.log" --nocapture
            ;;
        *) echo "gpu-check.sh: --rerun takes tests-unavailable, tests-cuda, tests-norms, tests-bench, memcheck or racecheck" >&2 && exit 1 ;;
    esac
    write_summary
    cat "$summary"
    grep -qE '\| FAILED' "$summary" && exit 1
    exit 0
fi

write_summary
step kernels "$out/kernels.txt" ./fusegrad devices --load
run_test tests-unavailable "$out/tests.log"
run_test tests-cuda "$out/tests.log"
run_test tests-norms "$out/tests.log"
run_test tests-bench "$out/tests.log"
: > "$out/bench.jsonl"
step bench "$out/bench.jsonl" ./fusegrad bench --device cuda --json "${bench_args[@]}"
# The step's own header line is not JSON; keep the rows only.
grep '^{' "$out/bench.jsonl" > "$scratch/rows"
mv "$scratch/rows" "$out/bench.jsonl"
if timeout -k 2 10 python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1; then
    : > "$out/torch.jsonl"
    step torch "$out/torch.jsonl" python3 bench_torch_cuda.py --fusegrad "$out/bench.jsonl" --table "$scratch/table.md"
    grep '^{' "$out/torch.jsonl" > "$scratch/rows"
    mv "$scratch/rows" "$out/torch.jsonl"
else
    echo '{"skipped":"no PyTorch with CUDA on this machine"}' > "$out/torch.jsonl"
    skip torch "no PyTorch with CUDA on this machine"
fi
# The emulation has no sanitizer; a stand-in on PATH (a rehearsal's) runs.
sanitize memcheck "$out/sanitizer.log"
sanitize racecheck "$out/sanitizer.log"
write_summary
echo
cat "$summary"
grep -qE '\| FAILED' "$summary" && exit 1
exit 0
