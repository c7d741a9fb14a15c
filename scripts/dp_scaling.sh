#!/usr/bin/env bash
# Data-parallel scaling on one machine, alternating in one sitting:
# 1 process with 2 threads (batch 16) against 2 MPI ranks with 1 thread
# each (batch 8 each), with one bucket (no overlap) and with small buckets
# (overlap). Needs `cargo build --release -p fusegrad-cli --features mpi`.
# Usage: scripts/dp_scaling.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-100}
bin=${FUSEGRAD_MPI_EXE:-target/release/fusegrad}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(train transformer --steps "$steps" --minutes 30 --plots target/plots/dp)
tok() { grep -o '[0-9]* tokens/s' | head -1; }
for r in $(seq "$rounds"); do
  a=$(RAYON_NUM_THREADS=2 "$bin" "${common[@]}" --batch 16 | tok)
  b=$(mpirun -np 2 --bind-to core -x RAYON_NUM_THREADS=1 "$bin" "${common[@]}" --batch 8 --data-parallel --bucket-mb 1000 | grep -E 'tokens/s|data parallel')
  c=$(mpirun -np 2 --bind-to core -x RAYON_NUM_THREADS=1 "$bin" "${common[@]}" --batch 8 --data-parallel --bucket-mb 0.25 | grep -E 'tokens/s|data parallel')
  echo "round $r: 1 process x 2 threads: $a"
  echo "  2 ranks, one bucket:   $(echo "$b" | tok); $(echo "$b" | grep 'data parallel')"
  echo "  2 ranks, 0.25 MB buckets: $(echo "$c" | tok); $(echo "$c" | grep 'data parallel')"
done
