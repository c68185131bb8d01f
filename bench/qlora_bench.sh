#!/usr/bin/env bash
# QLoRA measured (issue 37): a ~100M-parameter Llama-shaped base (L14 hidden 768, 12 heads,
# MLP 2048, byte vocabulary, T = 128), LoRA r = 16 on every linear layer, bf16, one rank and one
# thread, trained twice side by side: the base frozen in bf16 (plain LoRA), and the base's block
# linears in 4 bits (model.quantize: NF4, blocks of 64, double quantization). For each:
#   - the base's resident bytes as the memory accountant measures them: summary.json memory.frozen
#     (the bf16 run's whole base; the 4-bit run's embedding, final norm and head in bf16) plus the
#     4-bit run's quantized_base_bytes (the blocks' codes, statistics, norms); memory.quantized is
#     those bytes plus the 4-bit matmul's dequantization scratch (one fp32 panel of at most 4 MiB),
#     shown apart; both categories next to `fdtrain estimate`'s;
#   - the process's peak RSS (/usr/bin/time): the 4-bit run's resident base implied by RSS is its
#     RSS minus what the bf16 run held besides its base (RSS_bf16 - base_bf16);
#   - the step time (median ms per step after the first two steps, from metrics.jsonl).
# Goals: resident base <= 0.27x the bf16 base; step time <= 1.3x the bf16-base LoRA step.
#
#   bench/qlora_bench.sh [BUILD_DIR]     QLORA_BENCH_STEPS (default 8)
set -uo pipefail
BUILD_DIR=${1:-build}
FDTRAIN=$(realpath "$BUILD_DIR/bin/fdtrain")
STEPS=${QLORA_BENCH_STEPS:-8}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
R=$WORK/llama100m.yaml
cat >"$R" <<YAML
model: {arch: llama, n_layer: 14, n_head: 12, n_kv_head: 12, d_model: 768, d_ff: 2048,
        vocab_size: 256, max_seq_len: 128}
lora: {r: 16, alpha: 32, targets: [all-linear]}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/literature]
  val_fraction: 0.0
  seq_len: 128
batch: {micro: 2}
optimizer: {lr: 1.0e-3}
schedule: {name: constant, warmup_steps: 0}
precision: bf16
steps: $STEPS
logging: {every: 1, sample_tokens: 0}
checkpoint: {at_end: false}
YAML
Q=(model.quantize.type=nf4 model.quantize.block_size=64 model.quantize.double_quant=true)
json() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[int(k)] if isinstance(d,list) else d[k]
print(d)' "$1" "$2"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# Median ms per step after the first two (metrics.jsonl's tokens_per_s at logging.every 1).
step_ms() { python3 -c 'import json,sys,statistics
rows=[json.loads(l) for l in open(sys.argv[1]) if "tokens_per_s" in l]
tok=int(sys.argv[2]); v=[1000.0*tok/r["tokens_per_s"] for r in rows[2:] if r.get("tokens_per_s")]
print("%.0f" % statistics.median(v))' "$1" "$2"; }

echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "date: $(date -u +%Y-%m-%d)  threads: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
echo "model: Llama L14 hidden 768 heads 12 MLP 2048 V256 T128, micro 2, LoRA r16 all-linear, bf16, world 1, $STEPS steps"
printf "\n%-6s %9s %8s %11s %10s %10s %10s %10s %10s\n" "base" "RSS MiB" "step ms" "frozen MiB" "4-bit MiB" "scratch" "base MiB" "est. base" "est.=meas"
declare -A RSS MS BASE EST SCRATCH
for mode in bf16 nf4; do
  extra=()
  [ "$mode" = nf4 ] && extra=("${Q[@]}")
  /usr/bin/time -f "peak_rss_kb %M" "$FDTRAIN" train "$R" "${extra[@]}" --run-dir "$WORK/$mode" \
    --no-progress >"$WORK/$mode.log" 2>&1 || { echo "$mode run failed:"; tail -5 "$WORK/$mode.log"; exit 1; }
  "$FDTRAIN" estimate "$R" "${extra[@]}" --json >"$WORK/$mode.est" 2>/dev/null ||
    { echo "$mode estimate failed"; exit 1; }
  S=$WORK/$mode/summary.json
  frozen=$(json "$S" memory.frozen)
  quant=$(json "$S" memory.quantized)
  qbase=$(json "$S" quantized_base_bytes)
  ef=$(json "$WORK/$mode.est" stages.0.frozen)
  eq=$(json "$WORK/$mode.est" stages.0.quantized)
  eqb=0
  [ "$mode" = nf4 ] && eqb=$(json "$WORK/$mode.est" quantize.quantized_bytes)
  RSS[$mode]=$(awk '/peak_rss_kb/ {print $2 * 1024}' "$WORK/$mode.log")
  MS[$mode]=$(step_ms "$WORK/$mode/metrics.jsonl" 256)
  BASE[$mode]=$((frozen + qbase))
  SCRATCH[$mode]=$((quant - qbase))
  EST[$mode]=$((ef + eqb))
  same=no
  [ "$frozen" = "$ef" ] && [ "$quant" = "$eq" ] && same=yes
  printf "%-6s %9s %8s %11s %10s %10s %10s %10s %10s\n" "$mode" "$(mib "${RSS[$mode]}")" "${MS[$mode]}" \
    "$(mib "$frozen")" "$(mib "$qbase")" "$(mib $((quant - qbase)))" "$(mib "${BASE[$mode]}")" \
    "$(mib "${EST[$mode]}")" "$same"
done
# RSS holds the scratch too: the implied base is what remains after it.
rss_base=$(( ${RSS[nf4]} - (${RSS[bf16]} - ${BASE[bf16]}) - ${SCRATCH[nf4]} ))
echo
awk -v q="${BASE[nf4]}" -v b="${BASE[bf16]}" -v e="${EST[nf4]}" -v eb="${EST[bf16]}" -v r="$rss_base" \
  -v mq="${MS[nf4]}" -v mb="${MS[bf16]}" 'BEGIN {
  printf "resident base, 4-bit / bf16: measured %.3f, estimate %.3f, from RSS %.3f (approximate: other transients differ between the runs) (goal <= 0.27)\n", q / b, e / eb, r / b
  printf "step time, 4-bit / bf16 base: %.2fx (goal <= 1.3x)\n", mq / mb }'
