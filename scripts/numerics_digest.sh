#!/usr/bin/env bash
# The numbers a refactor must not change, from one build, in one folder:
#   scripts/numerics_digest.sh BUILD_DIR OUT_DIR
# then, for a build of the commit before and one after:
#   diff -r OUT_BEFORE OUT_AFTER      (no output: the same numerics)
#
# OUT_DIR/weights.txt: `weights_sha256` and the last loss of short runs of the
# shipped recipes (quickstart at world 2; ZeRO-3 bf16 with every block
# recomputed at world 2; the pipeline recipe at world 4, 1F1B and GPipe; LoRA
# on the Llama recipe from its own pre-trained base; NVMe optimizer offload;
# chat SFT from its own base), each with a few steps so that the whole script
# takes minutes on 2 cores.
# OUT_DIR/estimate/<recipe>.w<N>.json: `fdtrain estimate --json` of every
# shipped recipe at world 1, 2, 4 and 8 (the LoRA recipes against the bases
# made above; a world a recipe cannot run at is recorded as its error).
set -uo pipefail
BUILD=$(realpath "$1")
OUT=$(realpath -m "$2")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FD=$BUILD/bin/fdtrain
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun --oversubscribe --bind-to none)
cd "$ROOT"
mkdir -p "$OUT/estimate"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
: > "$OUT/weights.txt"

# run NAME WORLD RECIPE OVERRIDES...: one short run, its digest and last loss.
run() {
  local name=$1 world=$2 recipe=$3
  shift 3
  local dir=$WORK/$name
  if ! "${MPI[@]}" -n "$world" "$FD" train "$recipe" "$@" logging.sample_tokens=0 \
      --run-dir "$dir" --no-progress > "$WORK/$name.log" 2>&1; then
    echo "$name: FAILED (see below)" >> "$OUT/weights.txt"
    tail -5 "$WORK/$name.log" >> "$OUT/weights.txt"
    return
  fi
  python3 - "$dir/summary.json" "$name" >> "$OUT/weights.txt" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[2], s["status"], s["weights_sha256"], repr(s.get("final_loss")))
PY
}

run quickstart 2 recipes/quickstart.yaml steps=30
run zero3_bf16_ckpt 2 recipes/pretrain_zero3.yaml steps=6 precision=bf16 \
  activation_checkpointing.layers=all checkpoint.every=0
run pipeline_1f1b 4 recipes/pipeline_1f1b.yaml steps=4 checkpoint.every=0
run pipeline_gpipe 4 recipes/pipeline_1f1b.yaml steps=4 parallel.schedule=gpipe checkpoint.every=0
run offload_nvme 2 recipes/offload_nvme_zero3.yaml steps=4 "zero.offload_optimizer.path=$WORK" \
  checkpoint.every=0

# LoRA on the Llama recipe and chat SFT, each from a base made here.
run llama_base 2 recipes/pretrain_llama.yaml steps=10
"$FD" ckpt export "$WORK/llama_base" --hf-dir "$WORK/llama_hf" > /dev/null 2>&1
run lora_llama 2 recipes/lora_llama_zero2.yaml steps=4 "model.init_from=$WORK/llama_hf" \
  checkpoint.every=0
run chat_base 2 recipes/pretrain_chat_base.yaml steps=10
"$FD" ckpt export "$WORK/chat_base" --hf-dir "$WORK/chat_hf" > /dev/null 2>&1
run sft_chat 2 recipes/sft_chat_lora.yaml steps=4 "model.init_from=$WORK/chat_hf" \
  checkpoint.every=0
run gpt_base 1 recipes/pretrain_base.yaml steps=4
"$FD" ckpt export "$WORK/gpt_base" --out "$WORK/gpt_base.safetensors" > /dev/null 2>&1

for r in recipes/*.yaml; do
  name=$(basename "$r" .yaml)
  extra=()
  case $name in
    lora_zero2) extra=("model.init_from=$WORK/gpt_base.safetensors") ;;
    lora_llama_zero2) extra=("model.init_from=$WORK/llama_hf") ;;
    sft_chat_lora) extra=("model.init_from=$WORK/chat_hf") ;;
    offload_nvme_zero3) extra=("zero.offload_optimizer.path=$WORK") ;;
  esac
  for w in 1 2 4 8; do
    # The temporary folder's name appears in messages and paths: mask it.
    "$FD" estimate "$r" "${extra[@]}" --world-size "$w" --json 2>&1 |
      sed "s#$WORK#WORK#g" > "$OUT/estimate/$name.w$w.json"
  done
done
echo "$OUT: $(wc -l < "$OUT/weights.txt") runs, $(ls "$OUT/estimate" | wc -l) estimates"
