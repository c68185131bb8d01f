#!/usr/bin/env bash
# make bench: fdtrain's training throughput on configs S and M (fp32, one
# thread), next to the sgemm peak measured in the same run, then the PyTorch
# eager peer (bench/peer/torch_gpt.py) on the same configs in the same run.
# Both thread counts are pinned for both programs, and both use the same
# OpenBLAS kernel family (the one fdtrain selects; see lib/ops/blas_setup.h).
set -euo pipefail
BUILD_DIR=${1:-build}
STEPS=${BENCH_STEPS:-5}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "date: $(date -u +%Y-%m-%d)  threads: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
echo
out=$("$BUILD_DIR/bin/train_bench" --steps "$STEPS" --warmup 1 --threads 1 S M)
echo "$out"
kernel=$(sed -n 's/.*OpenBLAS kernel \([A-Za-z0-9]*\).*/\1/p' <<<"$out")
echo
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernel} /usr/bin/python3 bench/peer/torch_gpt.py --steps "$STEPS" S M
  echo "(PyTorch run with OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernel}, the kernel fdtrain uses)"
else
  echo "PyTorch peer skipped: /usr/bin/python3 cannot import torch (make bench installs python3-torch)"
fi
