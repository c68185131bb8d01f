#!/usr/bin/env bash
# Tensor parallelism measured (issue 39; docs/RECIPE.md, `parallel.tensor`), on a compute-bound
# Llama shape: L4, hidden 512, 8 query heads and 8 key/value heads of 64, SwiGLU 1408, byte
# vocabulary (256) with an untied head, T = 256, micro batch 2, fp32, ZeRO stage 0, one BLAS
# thread per rank. Prints only; writes nothing outside a temporary directory.
#  1. speed: tokens/s of T = 2 (mpirun -n 2: each rank half of every layer) against T = 1 on one
#     rank (the same global batch) and against D = 2 (data parallelism on the same 2 cores);
#  2. traffic: the bytes each rank sends over its tensor- (sequence-) parallel group per step, as
#     the run measured them (summary.json), as `fdtrain estimate` counts them, and by the formula:
#     Megatron-LM's (per micro-batch (4L + 1) all-reduces of B x T x H values, and the
#     vocabulary-parallel loss's statistics and dh; ring model: 2 (T - 1) / T of each
#     all-reduce's bytes on the wire) at T = 2 and 4, with sequence parallelism (reduce-scatter /
#     all-gather pairs of the same total) at T = 2, and DeepSpeed-Ulysses' (4 all-to-alls of
#     B x T/S x H per block forward, 4 backward) at S = 2 and 4;
#  3. memory per rank at T = 2 (with and without sequence parallelism) and S = 2 against T = 1:
#     params, grads, optimizer, activations.
#
#   bench/tensor_parallel_bench.sh [BUILD_DIR]
#   TP_BENCH_STEPS (default 6): steps per run (ms/step excludes the first).
#   TP_BENCH_TRIES (default 2): runs of each speed configuration, the fastest kept.
set -euo pipefail
BUILD_DIR=${1:-build}
STEPS=${TP_BENCH_STEPS:-6}
TRIES=${TP_BENCH_TRIES:-2}
FDTRAIN=$(realpath "$BUILD_DIR/bin/fdtrain")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$WORK/tp.yaml
cat >"$R" <<YAML
model: {arch: llama, n_layer: 4, n_head: 8, n_kv_head: 8, d_model: 512, d_ff: 1408,
        vocab_size: 256, max_seq_len: 256, tie_embeddings: false}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/literature,
          /usr/share/games/fortunes/people, /usr/share/games/fortunes/science]
  val_fraction: 0.0
  seq_len: 256
batch: {micro: 2, global: 4}
optimizer: {lr: 3.0e-4, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
precision: fp32
zero: {stage: 0}
threads: 1
seed: 1
steps: $STEPS
logging: {every: 1000, sample_tokens: 0}
checkpoint: {at_end: false}
YAML

run() {  # run NAME RANKS [key=value ...]
  local name=$1 n=$2
  shift 2
  timeout 900 mpirun --oversubscribe --bind-to none -n "$n" "$FDTRAIN" train "$R" "$@" \
    --run-dir "$WORK/$name" --overwrite --no-progress >"$WORK/$name.log" 2>&1 || {
    echo "run $name (-n $n $*) failed:"
    tail -20 "$WORK/$name.log"
    exit 1
  }
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[k]
print(d)' "$WORK/$1/summary.json" "$2"; }
best() {  # best NAME RANKS [key=value ...]: $TRIES runs, the fastest kept as NAME
  local name=$1 t keep="" ms min=""
  for t in $(seq "$TRIES"); do
    run "$name.$t" "${@:2}"
    ms=$(field "$name.$t" ms_per_step)
    if [ -z "$min" ] || awk -v a="$ms" -v b="$min" 'BEGIN { exit !(a < b) }'; then min=$ms keep=$t; fi
  done
  mv "$WORK/$name.$keep" "$WORK/$name"
}

echo "== tensor parallelism: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores"
echo "   model L4 hidden 512, 8/8 heads, SwiGLU 1408, V 256, T 256; global batch 4 sequences, fp32"
best t1 1 batch.accumulation=2
best t2 2 parallel.tensor=2 batch.accumulation=2
best d2 2 batch.accumulation=1
printf '%-34s %12s %12s %10s\n' "layout (ranks)" "ms/step" "tokens/s" "vs T=1"
base=$(field t1 tokens_per_s)
for name in t1 t2 d2; do
  case $name in t1) label="T=1 (1 rank)";; t2) label="T=2 (2 ranks, 1 replica)";; d2) label="T=1 x D=2 (2 ranks)";; esac
  tps=$(field "$name" tokens_per_s)
  printf '%-34s %12.1f %12.0f %9.2fx\n' "$label" "$(field "$name" ms_per_step)" "$tps" \
    "$(awk -v a="$tps" -v b="$base" 'BEGIN { print a / b }')"
done

echo
echo "== bytes per step and rank over the tensor- or sequence-parallel group: measured (summary.json),"
echo "   counted by fdtrain estimate, and the formula (Megatron-LM without and with sequence parallelism,"
echo "   DeepSpeed-Ulysses)"
printf '%-24s %16s %16s %16s\n' "layout" "measured" "estimate" "formula"
traffic() {  # traffic NAME RANKS KIND LABEL key=value...: a run, its estimate, the formula
  local name=$1 n=$2 kind=$3 label=$4
  shift 4
  [ -d "$WORK/$name" ] || run "$name" "$n" "$@"
  "$FDTRAIN" estimate "$R" "$@" --world-size "$n" --json >"$WORK/$name.est.json"
  python3 - "$WORK/$name/summary.json" "$WORK/$name.est.json" "$kind" "$label" <<'PY'
import json, sys
s, e, kind, label = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
m, t = s[kind]["bytes_per_step"], e[kind]
print(f"{label:<24} {m:>16,} {t['bytes_per_step']:>16,} {t['formula_bytes_per_step']:>16,}"
      + ("   equal" if m == t["bytes_per_step"] == t["formula_bytes_per_step"] else "   DIFFER"))
PY
}
traffic t2 2 tensor_parallel "T=2" parallel.tensor=2 batch.accumulation=2
traffic t4 4 tensor_parallel "T=4" parallel.tensor=4 batch.accumulation=2
traffic t2sp 2 tensor_parallel "T=2, sequence_parallel" parallel.tensor=2 parallel.sequence_parallel=true batch.accumulation=2
traffic s2 2 sequence_parallel "S=2 (Ulysses)" parallel.sequence=2 batch.accumulation=2
traffic s4 4 sequence_parallel "S=4 (Ulysses)" parallel.sequence=4 batch.accumulation=2

echo
echo "== memory per rank (bytes) against T=1"
python3 - "$WORK"/{t1,t2,t2sp,s2}/summary.json <<'PY'
import json, sys
a, *rest = (json.load(open(p))["memory"] for p in sys.argv[1:])
print(f"  {'':<12} {'T=1':>12} " + " ".join(f"{n:>20}" for n in ("T=2", "T=2 + SP", "S=2 (Ulysses)")))
for k in ("params", "grads", "optimizer", "activations"):
    print(f"  {k:<12} {a[k]:>12,} " + " ".join(f"{b[k]:>12,} ({b[k] / a[k]:.3f}x)" for b in rest))
PY
