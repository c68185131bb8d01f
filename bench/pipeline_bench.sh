#!/usr/bin/env bash
# Pipeline parallelism measured (issue 22; docs/RECIPE.md, `parallel`), on a
# Llama-shaped model whose stages are balanced: L8, hidden 256, 4 heads, d_ff
# 688, byte vocabulary (256) with an untied head, T = 128, micro batch 1,
# fp32, ZeRO stage 0, partition uniform ([4, 4] at P = 2: the embedding and
# the head are the same size), one BLAS thread per rank. Prints only; writes
# nothing outside a temporary directory.
#  1. the bubble: P = 2 x D = 1 (mpirun -n 2) with 1F1B for M = 4, 8, 16
#     micro-batches (batch.accumulation): summary.json's measured
#     pipeline.idle_fraction per stage against (P - 1) / (M + P - 1), ms per
#     step, and the time against P = 1 with the same M (ideal speed-up
#     P M / (M + P - 1)); with the ranks unbound (--bind-to none, as the other
#     benches run) and bound to a core each (--bind-to core: no thread of one
#     rank is scheduled on the other's core);
#  2. 1F1B's activation peak against GPipe's at P = 2, M = 8 (per rank);
#  3. memory per rank at P = 2 against P = 1 x D = 1 (one rank, the same
#     global batch): params, grads, master, optimizer, activations;
#  4. P = 4 x D = 1 (mpirun -n 4) at M = 8 and 16: oversubscribed when the
#     machine has fewer than 4 cores (its idle then includes waiting for a core).
#
#   bench/pipeline_bench.sh [BUILD_DIR]
#   PIPE_BENCH_STEPS (default 10): steps per run (ms/step excludes the first;
#   idle_fraction counts every step).
#   PIPE_BENCH_TRIES (default 2): runs of each configuration in sections 1-2,
#   the fastest kept (other processes on a shared machine stretch a step, and a
#   rank descheduled mid-step shows as its neighbour's idle time).
set -euo pipefail
BUILD_DIR=${1:-build}
STEPS=${PIPE_BENCH_STEPS:-10}
TRIES=${PIPE_BENCH_TRIES:-2}
CORES=$(nproc --all)  # not nproc: it reads OMP_NUM_THREADS
FDTRAIN=$(realpath "$BUILD_DIR/bin/fdtrain")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$WORK/pipe.yaml
cat >"$R" <<YAML
model: {arch: llama, n_layer: 8, n_head: 4, d_model: 256, d_ff: 688, vocab_size: 256,
        max_seq_len: 128, tie_embeddings: false}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/literature,
          /usr/share/games/fortunes/people, /usr/share/games/fortunes/science]
  val_fraction: 0.0
  seq_len: 128
batch: {micro: 1, accumulation: 8}
optimizer: {lr: 3.0e-4, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
precision: fp32
zero: {stage: 0}
parallel: {pipeline: 2, schedule: 1f1b, partition: uniform}
threads: 1
seed: 1
steps: $STEPS
logging: {every: 1000, sample_tokens: 0}
checkpoint: {at_end: false}
YAML

# run NAME RANKS [key=value ...]: one training run into $WORK/NAME, ranks bound as $BIND.
BIND=none
run() {
  local name=$1 n=$2
  shift 2
  timeout 600 mpirun --oversubscribe --bind-to "$BIND" -n "$n" "$FDTRAIN" train "$R" "$@" \
    --run-dir "$WORK/$name" --overwrite --no-progress >"$WORK/$name.log" 2>&1 || {
    echo "run $name (-n $n --bind-to $BIND $*) failed:"
    tail -20 "$WORK/$name.log"
    exit 1
  }
}
# best NAME RANKS [key=value ...]: $TRIES runs, the one with the least ms/step kept as NAME.
best() {
  local name=$1 t keep="" ms min=""
  for t in $(seq "$TRIES"); do
    run "$name.$t" "${@:2}"
    ms=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ms_per_step"])' \
      "$WORK/$name.$t/summary.json")
    if [ -z "$min" ] || awk -v a="$ms" -v b="$min" 'BEGIN { exit !(a < b) }'; then min=$ms keep=$t; fi
  done
  mv "$WORK/$name.$keep" "$WORK/$name"
}
# j NAME EXPR: a Python expression over the summary `s`, printed.
j() {
  python3 -c "import json, sys
$PY_ROW
s = json.load(open(sys.argv[1]))
mem = s.get('memory_per_rank') or [s['memory']]
pipe = s.get('pipeline') or {}
print(eval(sys.argv[2]))" "$WORK/$1/summary.json" "$2"
}
# est NAME RANKS [key=value ...]: fdtrain estimate's JSON for the same recipe, as $WORK/NAME.est.
est() {
  "$FDTRAIN" estimate "$R" "${@:3}" --world-size "$2" --json >"$WORK/$1.est" 2>"$WORK/$1.est.log" || {
    echo "fdtrain estimate for $1 failed:"
    tail -5 "$WORK/$1.est.log"
    exit 1
  }
}
# e NAME EXPR: over the estimate, `st` = its per-stage list (pipeline.per_stage, or at P = 1 the
# recipe's ZeRO stage as a one-element list, with comm_buffers named comm as in summary.json).
PY_ROW='def row(m):
    return " ".join(["%10.2f" % (m[k] / 2**20) for k in ("params", "grads", "master", "optimizer")]
                    + ["%12.2f" % (m["activations"] / 2**20)]
                    + ["%10.2f" % (m[k] / 2**20) for k in ("comm", "total")])'
e() {
  python3 -c "import json, sys
$PY_ROW
d = json.load(open(sys.argv[1]))
st = (d.get('pipeline') or {}).get('per_stage') or [d['stages'][d['recipe_stage']]]
st = [dict(x, comm=x.get('comm_buffers', x.get('comm', 0))) for x in st]
print(eval(sys.argv[2]))" "$WORK/$1.est" "$2"
}

echo "machine: $CORES cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  threads: 1 BLAS thread per rank; $STEPS steps per run, sections 1-2 best of $TRIES runs"
echo "model: Llama L8 hidden 256 heads 4 d_ff 688 V256 (untied) T128, micro 1, fp32, ZeRO-0, partition uniform"

echo
echo "1. bubble: P=2 x D=1 (mpirun -n 2), 1F1B; idle = summary.json pipeline.idle_fraction (share of"
echo "   each step's pipeline phase blocked on a neighbour); theory (P-1)/(M+P-1)"
printf "%-4s %-6s %12s %12s %10s %10s %10s %14s %12s %14s\n" M bind "P=1 ms/step" "P=2 ms/step" \
  speedup ideal theory "idle s0 / s1" "stage_blocks" "p2p KiB s0/s1"
for M in 4 8 16; do
  best "p1m$M" 1 parallel.pipeline=1 batch.accumulation=$M
  for BIND in none core; do
    name=p2m$M
    [ "$BIND" = core ] && name=p2m${M}core
    best "$name" 2 batch.accumulation=$M
    t1=$(j "p1m$M" 's["ms_per_step"]')
    t2=$(j "$name" 's["ms_per_step"]')
    idle=$(j "$name" "' / '.join('%.3f' % x for x in pipe['idle_fraction'])")
    blocks=$(j "$name" "str(pipe['stage_blocks']).replace(' ', '')")
    bub=$(j "$name" "'%.3f' % pipe['bubble_fraction']")
    kib=$(j "$name" "'/'.join('%.0f' % (b / 1024) for b in pipe['p2p_bytes_per_step'])")
    awk -v m="$M" -v bi="$BIND" -v a="$t1" -v b="$t2" -v bub="$bub" -v idle="$idle" -v bl="$blocks" -v k="$kib" \
      'BEGIN { printf "%-4s %-6s %12.1f %12.1f %9.2fx %9.2fx %10s %14s %12s %14s\n", m, bi, a, b, a / b, 2 * m / (m + 1), bub, idle, bl, k }'
  done
done
BIND=none
echo "(P=1: one rank, unbound. speedup: P=1 ms/step / P=2 ms/step, the same global batch; ideal 2M/(M+1):"
echo " balanced stages, free transfers; the optimizer step is in ms/step too. Sections 2-4: --bind-to none)"

echo
echo "2. activation peak per rank (MiB): measured (summary.json memory_per_rank activations) and"
echo "   fdtrain estimate's (pipeline.per_stage), P=2 x D=1, M=8"
best p2gpipe 2 parallel.schedule=gpipe
est p2m8 2
est p2gpipe 2 parallel.schedule=gpipe
printf "%-8s %16s %16s %16s %16s %10s %20s
" schedule "s0 measured" "s0 estimate" "s1 measured" \
  "s1 estimate" ms/step "held s0/s1 (theory)"
for name in p2m8 p2gpipe; do
  sched=$(j $name 'pipe["schedule"]')
  held="2 / 1"
  [ "$sched" = gpipe ] && held="8 / 8"
  printf "%-8s %16s %16s %16s %16s %10s %20s\n" "$sched" "$(j $name "'%.2f' % (mem[0]['activations'] / 2**20)")" \
    "$(e $name "'%.2f' % (st[0]['activations'] / 2**20)")" \
    "$(j $name "'%.2f' % (mem[-1]['activations'] / 2**20)")" \
    "$(e $name "'%.2f' % (st[-1]['activations'] / 2**20)")" "$(j $name "'%.1f' % s['ms_per_step']")" "$held"
done
awk -v a="$(j p2m8 'mem[0]["activations"]')" -v b="$(j p2gpipe 'mem[0]["activations"]')" \
  'BEGIN { printf "stage 0: GPipe / 1F1B = %.2fx (micro-batches in flight: M / min(P, M) = 4x)\n", b / a }'

echo
echo "3. memory per rank (MiB): P=1 x D=1 (1 rank) against P=2 x D=1 (2 ranks), the same global"
echo "   batch (micro 1 x M 8), 1F1B; measured = summary.json memory_per_rank, estimate = fdtrain estimate"
est p1m8 1 parallel.pipeline=1
printf "%-30s %10s %10s %10s %10s %12s %10s %10s\n" "" params grads master optimizer activations comm total
mem_rows() {  # NAME RANK LABEL
  printf "%-30s %s\n" "$3 measured" "$(j "$1" "row(mem[$2])")"
  printf "%-30s %s\n" "$3 estimate" "$(e "$1" "row(st[$2])")"
}
mem_rows p1m8 0 "P=1, rank 0"
mem_rows p2m8 0 "P=2, rank 0 (stage 0)"
mem_rows p2m8 1 "P=2, rank 1 (stage 1)"
for r in 0 1; do
  printf "%-30s %s\n" "P=2 rank $r / P=1 (measured)" "$(python3 -c 'import json, sys
a = json.load(open(sys.argv[1]))["memory_per_rank"][0]
b = json.load(open(sys.argv[2]))["memory_per_rank"][int(sys.argv[3])]
print(" ".join("%10s" % ("%.3f" % (b[k] / a[k]) if a[k] else "-") for k in
  ("params", "grads", "master", "optimizer")), "%12.3f" % (b["activations"] / a["activations"]))' \
    "$WORK/p1m8/summary.json" "$WORK/p2m8/summary.json" $r)"
done
j p2m8 "'stage_blocks %s: stage 0 also holds the embedding, stage 1 the final norm and the head' % pipe['stage_blocks']"

echo
if [ "$CORES" -lt 4 ]; then
  echo "4. P=4 x D=1 (mpirun -n 4 on $CORES cores: OVERSUBSCRIBED, 2 ranks per core; idle includes waiting for a core), 1F1B"
else
  echo "4. P=4 x D=1 (mpirun -n 4), 1F1B"
fi
printf "%-4s %12s %34s %10s %14s\n" M "ms/step" "idle s0 / s1 / s2 / s3" theory "stage_blocks"
for M in 8 16; do
  run "p4m$M" 4 parallel.pipeline=4 batch.accumulation=$M
  printf "%-4s %12s %34s %10s %14s\n" "$M" "$(j "p4m$M" "'%.1f' % s['ms_per_step']")" \
    "$(j "p4m$M" "' / '.join('%.3f' % x for x in pipe['idle_fraction'])")" \
    "$(j "p4m$M" "'%.3f' % pipe['bubble_fraction']")" \
    "$(j "p4m$M" "str(pipe['stage_blocks']).replace(' ', '')")"
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
