#!/usr/bin/env bash
# make bench: fdtrain's training throughput on configs S, M, 124M (GPT-2) and
# Llama-S (Llama family) (fp32, one thread), next to the sgemm peak measured in
# the same run, and the PyTorch eager peer (bench/peer/torch_gpt.py) on the
# same configs in the same run, alternately; then the whole machine at each
# one's best setting on S, and a summary of the fdtrain/PyTorch ratios.
#
#   bench/run_bench.sh [BUILD_DIR [CONFIG...]]
#   BUILD_DIR  default build
#   CONFIG     S, M, 124M, Llama-S; default all four. Naming configs runs only
#              the one-core comparison and its summary for them (no data
#              parallel, precision, checkpoint, ceiling, CPU AdamW or NVMe offload sections), e.g.
#              bench/run_bench.sh build S Llama-S
#   BENCH_STEPS (default 5), BENCH_STEPS_124M (default 2): timed steps.
# Both thread counts are pinned for both programs, and both use the same
# OpenBLAS kernel family (the one fdtrain selects; see lib/ops/blas_setup.h).
set -euo pipefail
BUILD_DIR=${1:-build}
ALL_CONFIGS=(S M 124M Llama-S)
CONFIGS=("${@:2}")
ONLY_ONE_CORE=1
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=("${ALL_CONFIGS[@]}") && ONLY_ONE_CORE=0
for cfg in "${CONFIGS[@]}"; do
  [[ " ${ALL_CONFIGS[*]} " == *" $cfg "* ]] || {
    echo "run_bench.sh: unknown config '$cfg' (${ALL_CONFIGS[*]})" >&2
    exit 2
  }
done
STEPS=${BENCH_STEPS:-5}
STEPS_124M=${BENCH_STEPS_124M:-2}  # 124M at batch 1 x 1024 tokens: seconds per step
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "date: $(date -u +%Y-%m-%d)  threads: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
echo "configs: S = L4 C256 H4 V256 T256 B8; M = L6 C512 H8 V256 T256 B4;"
echo "         124M = GPT-2 L12 C768 H12 V50257 T1024 B1 ($STEPS_124M timed steps; others: $STEPS);"
echo "         Llama-S = Llama L6 hidden 512 heads 8 (kv 2) head_dim 64 I1408 V32000 T256 B4, untied head"
echo "configs run: ${CONFIGS[*]}"
echo

# One core each, one process per config (so that peak RSS is that config's),
# fdtrain and PyTorch alternately.
have_torch=0
/usr/bin/python3 -c "import torch" 2>/dev/null && have_torch=1
declare -A F_TOK F_RSS P_TOK P_RSS
row() { grep -E "^$1 " <<<"$2" | head -1; }
cfg_row_re="^($(IFS='|'; echo "${ALL_CONFIGS[*]}")) "
fd_rows="" pt_rows="" fd_head="" pt_head="" kernel=""
for cfg in "${CONFIGS[@]}"; do
  steps=$STEPS; [ "$cfg" = 124M ] && steps=$STEPS_124M
  out=$("$BUILD_DIR/bin/train_bench" --steps "$steps" --warmup 1 --threads 1 "$cfg")
  [ -z "$fd_head" ] && fd_head=$(grep -v -E "$cfg_row_re" <<<"$out")
  [ -z "$kernel" ] && kernel=$(sed -n 's/.*OpenBLAS kernel \([A-Za-z0-9]*\).*/\1/p' <<<"$out")
  r=$(row "$cfg" "$out"); fd_rows+="$r"$'\n'
  F_TOK[$cfg]=$(awk '{print $3}' <<<"$r"); F_RSS[$cfg]=$(awk '{print $6}' <<<"$r")
  if [ "$have_torch" = 1 ]; then
    out=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernel} /usr/bin/python3 bench/peer/torch_gpt.py \
      --steps "$steps" "$cfg")
    [ -z "$pt_head" ] && pt_head=$(grep -v -E "$cfg_row_re" <<<"$out")
    r=$(row "$cfg" "$out"); pt_rows+="$r"$'\n'
    P_TOK[$cfg]=$(awk '{print $3}' <<<"$r"); P_RSS[$cfg]=$(awk '{print $6}' <<<"$r")
  fi
done
sed "/^sgemm/s/\$/ (the ${CONFIGS[0]} process; %peak per config: its own process)/" <<<"$fd_head"
printf "%s" "$fd_rows"
echo
if [ "$have_torch" = 1 ]; then
  sed "/^sgemm/s/\$/ (the ${CONFIGS[0]} process; %peak per config: its own process)/" <<<"$pt_head"
  printf "%s" "$pt_rows"
  echo "(PyTorch run with OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernel}, the kernel fdtrain uses)"
else
  echo "PyTorch peer skipped: /usr/bin/python3 cannot import torch (make bench installs python3-torch)"
fi

# The machine-level sections: all configs only (bench/run_bench.sh BUILD_DIR alone).
if [ "$ONLY_ONE_CORE" = 0 ]; then
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

  # The whole machine, each at its best setting, config S: fdtrain world 2 (one
  # thread per rank, ZeRO-2, micro batch 8 per rank; the run above) against
  # PyTorch with the two thread settings that use both cores, the better kept.
  echo
  echo "whole machine, config S, each at its best setting (tok/s: per-token throughput)"
  W_FD=$(field "$OUT/w2s2" tokens_per_s)
  W_FD_RSS=$(field "$OUT/w2s2" peak_rss_bytes)
  W_PT="" W_PT_RSS="" W_PT_SET=""
  printf "%-58s %10s %12s\n" program tok/s "RSS MiB"
  awk -v t="$W_FD" -v r="$W_FD_RSS" 'BEGIN { printf "%-58s %10.0f %12.0f\n", "fdtrain mpirun -n 2, ZeRO-2, 1 thread/rank, micro 8/rank", t, r / 1048576 }'
  if [ "$have_torch" = 1 ]; then
    for setting in "1 2" "2 1"; do
      read -r omp ob <<<"$setting"
      r=$(OMP_NUM_THREADS=$omp OPENBLAS_NUM_THREADS=$ob OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$kernel} \
        /usr/bin/python3 bench/peer/torch_gpt.py --steps "$STEPS" S | grep -E '^S ')
      t=$(awk '{print $3}' <<<"$r"); m=$(awk '{print $6}' <<<"$r")
      printf "%-58s %10.0f %12.0f\n" "PyTorch B8, OMP_NUM_THREADS=$omp OPENBLAS_NUM_THREADS=$ob" "$t" "$m"
      if [ -z "$W_PT" ] || awk -v a="$t" -v b="$W_PT" 'BEGIN { exit !(a > b) }'; then
        W_PT=$t W_PT_RSS=$m W_PT_SET="OMP=$omp OPENBLAS=$ob"
      fi
    done
    awk -v f="$W_FD" -v p="$W_PT" -v s="$W_PT_SET" -v o="${F_TOK[S]}" \
      'BEGIN { printf "fdtrain world 2 / PyTorch best (%s): %.2fx tok/s; fdtrain world 2 / fdtrain one core: %.2fx\n", s, f / p, f / o }'
  fi

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

  # The CPU AdamW pass (lib/ops/cpu/adamw.cc) on 64 Mi elements, per kernel, 1 and 2 threads,
  # against a triad in the same process, then torch.optim.AdamW(foreach=True) on the same N.
  echo
  echo "CPU AdamW: fused pass vs STREAM-like triad (same process, same threads) and torch foreach AdamW"
  aw=$("$BUILD_DIR/bin/adamw_bench" --threads 1 2)
  echo "$aw"
  if [ "$have_torch" = 1 ]; then
    echo
    pt=$(/usr/bin/python3 bench/peer/adamw_torch.py --threads 1 2)
    echo "$pt"
    best=$(sed -n 's/.*(default: \([a-z0-9]*\)).*/\1/p' <<<"$aw")
    for t in 1 2; do
      fd_ms=$(awk -v t="$t" -v k="$best" '$1 == t && /adamw fp32 grads/ && $5 == k { print $6 }' <<<"$aw")
      pt_ms=$(awk -v t="$t" '$1 == t && /torch AdamW/ { print $(NF - 1) }' <<<"$pt")
      awk -v t="$t" -v f="$fd_ms" -v p="$pt_ms" -v k="$best" \
        'BEGIN { printf "fdtrain (%s) / torch foreach AdamW, fp32 grads, %d thread(s): %.2fx\n", k, t, p / f }'
    done
  else
    echo "PyTorch AdamW peer skipped: /usr/bin/python3 cannot import torch"
  fi
  # The NVMe tier's optimizer pass (48 Mi bf16 parameters: 600 MB of state) against the
  # sequential bandwidth of the same file system, in one process (bench/offload_bench.cc).
  echo
  echo "NVMe offload: the streamed AdamW pass vs the file system's sequential bandwidth"
  "$BUILD_DIR/bin/offload_bench" --elements 50331648 --steps 3 --threads 1
fi

if [ "$have_torch" = 1 ]; then
  echo
  echo "summary: fdtrain / PyTorch (tok/s ratio > 1: fdtrain faster; RSS ratio < 1: fdtrain smaller)"
  printf "%-22s %12s %12s %10s %12s %12s %10s\n" config "fd tok/s" "pt tok/s" "tok/s x" \
    "fd RSS MiB" "pt RSS MiB" "RSS x"
  for cfg in "${CONFIGS[@]}"; do
    awk -v c="$cfg, one core" -v ft="${F_TOK[$cfg]}" -v pt="${P_TOK[$cfg]}" -v fr="${F_RSS[$cfg]}" \
      -v pr="${P_RSS[$cfg]}" 'BEGIN { printf "%-22s %12.0f %12.0f %9.2fx %12.0f %12.0f %9.2fx\n", c, ft, pt, ft / pt, fr, pr, fr / pr }'
  done
  if [ "$ONLY_ONE_CORE" = 0 ]; then
    awk -v ft="$W_FD" -v pt="$W_PT" -v fr="$W_FD_RSS" -v pr="$W_PT_RSS" \
      'BEGIN { printf "%-22s %12.0f %12.0f %9.2fx %12.0f %12.0f %9.2fx\n", "S, whole machine", ft, pt, ft / pt, fr / 1048576, pr, fr / 1048576 / pr }'
    echo "(whole machine: fdtrain RSS is rank 0's process; each of its 2 ranks holds about as much)"
  fi
fi
