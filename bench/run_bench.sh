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

# Data parallelism: config S on real text, world 1 vs world 2 (1 BLAS thread
# per rank, micro batch 8 per rank: weak scaling), every ZeRO stage, and the
# time each step's compute thread spent blocked on communication.
echo
echo "fdtrain data parallel: config S, micro batch 8 per rank, fp32, 1 thread per rank, 12 steps"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
field() { sed -n "s/^  \"$2\": \\([0-9.e+-]*\\),*$/\\1/p" "$1/summary.json"; }
OUT=$(mktemp -d)
printf "%-6s %-6s %10s %12s %10s %16s %14s\n" world stage tok/s ms/step speedup "comm wait ms" "comm MiB/step"
base=""
for world in 1 2; do
  for stage in 0 1 2 3; do
    [ "$world" = 1 ] && [ "$stage" != 0 ] && continue
    mpirun --oversubscribe --bind-to none -n "$world" "$BUILD_DIR/bin/fdtrain" train \
      bench/recipes/s_fortunes.yaml zero.stage=$stage --run-dir "$OUT/w${world}s$stage" \
      --overwrite --no-progress > "$OUT/log" 2>&1 || { cat "$OUT/log"; exit 1; }
    d="$OUT/w${world}s$stage"
    tps=$(field "$d" tokens_per_s); ms=$(field "$d" ms_per_step)
    wait_s=$(field "$d" comm_wait_s_per_step); bytes=$(field "$d" comm_bytes_per_step)
    [ -z "$base" ] && base=$tps
    awk -v w="$world" -v s="$stage" -v t="$tps" -v m="$ms" -v b="$base" -v ws="$wait_s" -v by="$bytes" \
      'BEGIN { printf "%-6s %-6s %10.0f %12.1f %9.2fx %16.1f %14.2f\n", w, s, t, m, t / b, ws * 1e3, by / 1048576 }'
  done
done

# Precision and activation checkpointing: config S, one rank, 12 steps.
echo
echo "fdtrain precision x activation checkpointing: config S, world 1, micro batch 8, 12 steps"
printf "%-6s %-10s %12s %10s %18s %12s\n" dtype checkpoint ms/step overhead "peak activations" ratio
for p in fp32 bf16 fp16; do
  base_ms=""; base_act=""
  for ck in none all; do
    d="$OUT/p${p}c$ck"
    "$BUILD_DIR/bin/fdtrain" train bench/recipes/s_fortunes.yaml precision=$p \
      activation_checkpointing.layers=$ck --run-dir "$d" --overwrite --no-progress > "$OUT/log" 2>&1 \
      || { cat "$OUT/log"; exit 1; }
    ms=$(field "$d" ms_per_step)
    act=$(sed -n 's/^    "activations": \([0-9]*\),*$/\1/p' "$d/summary.json" | head -1)
    [ -z "$base_ms" ] && base_ms=$ms && base_act=$act
    awk -v p="$p" -v c="$ck" -v m="$ms" -v bm="$base_ms" -v a="$act" -v ba="$base_act" \
      'BEGIN { printf "%-6s %-10s %12.1f %9.2fx %14.1f MiB %11.3fx\n", p, c, m, m / bm, a / 1048576, a / ba }'
  done
done

# Checkpoint cost: config M, world 2, ZeRO stage 1, a checkpoint every 5 steps.
echo
echo "fdtrain checkpoints: config M, world 2, stage 1, fp32, save every 5 of 10 steps"
d="$OUT/ckpt"
mpirun --oversubscribe --bind-to none -n 2 "$BUILD_DIR/bin/fdtrain" train bench/recipes/m_fortunes.yaml \
  zero.stage=1 steps=10 checkpoint.every=5 --run-dir "$d" --overwrite --no-progress > "$OUT/log" 2>&1 \
  || { cat "$OUT/log"; exit 1; }
save_s=$(field "$d" checkpoint_s_per_save); ms=$(field "$d" ms_per_step)
bytes=$(stat -c %s "$d"/checkpoints/step_00000010/rank_00000.h5)
awk -v s="$save_s" -v m="$ms" -v b="$bytes" 'BEGIN { printf "save %.1f ms per checkpoint (%.2f of a %.1f ms step), %.1f MiB per rank\n", s * 1e3, s * 1e3 / m, m, b / 1048576 }'
rm -rf "$OUT"
# Two independent single-thread processes side by side: the ceiling for world 2 on this machine.
echo
echo "ceiling: two independent train_bench processes on config S at once (ms/step each)"
( "$BUILD_DIR/bin/train_bench" --steps 3 --threads 1 S & "$BUILD_DIR/bin/train_bench" --steps 3 --threads 1 S; wait ) | grep '^S '
