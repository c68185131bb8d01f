#!/usr/bin/env bash
# make bench: fdtrain's single-thread training throughput on configs S and M,
# next to the sgemm peak measured in the same run. Both thread counts pinned.
set -euo pipefail
BUILD_DIR=${1:-build}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "date: $(date -u +%Y-%m-%d)  threads: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
"$BUILD_DIR/bin/train_bench" --steps "${BENCH_STEPS:-5}" --warmup 1 --threads 1 S M
