#!/usr/bin/env bash
# Checkpoints of the Llama family (GQA, RoPE, SwiGLU, untied head; and a LoRA
# run on a Hugging Face directory's base) resume bitwise and reshard:
#   - world 2, ZeRO-3, bf16, checkpointed blocks: 20 steps uninterrupted, and
#     10 + a resume from step 10: the same weights_sha256;
#   - the same with LoRA on a base read from a Hugging Face directory
#     (model.init_from, partitioned under ZeRO-3);
#   - fp32, a world-2 stage-3 checkpoint resumed at world 4 stage 1 and at world
#     1 stage 0: after 10 more steps the weights match an uninterrupted run at
#     that world size to ||dw|| / ||w|| <= 1e-5.
source "$(dirname "$0")/common.bash"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 20/' "$R"
sed -i 's/^  n_layer: 1/  arch: llama\n  n_layer: 2\n  n_kv_head: 1\n  d_ff: 48/; s/^  n_head: 2/  n_head: 4/; s/^  d_model: 16/  d_model: 32/' "$R"
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }
run() {  # run WORLD MICRO DIR [ARGS...]
  local world=$1 micro=$2 dir=$3; shift 3
  local cmd=("$FDTRAIN" train "$R" batch.micro=$micro checkpoint.every=10 "$@" --run-dir "$dir" --no-progress)
  if [ "$world" = 1 ]; then "${cmd[@]}"; else timeout 300 mpirun --oversubscribe --bind-to none -n "$world" "${cmd[@]}"; fi \
    > "$dir.log" 2>&1 || { echo "FAIL: run in $dir"; tail -5 "$dir.log"; FAILURES=$((FAILURES+1)); }
}
same_sha() {  # same_sha NAME RESUMED REFERENCE
  local a b; a=$(sha "$2"); b=$(sha "$3")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "ok: $1: resumed weights_sha256 ${a:0:16} = uninterrupted"
  else
    echo "FAIL: $1: resumed '$a' vs uninterrupted '$b'"; FAILURES=$((FAILURES+1))
  fi
}

B16=(zero.stage=3 precision=bf16 activation_checkpointing.layers=all)
run 2 2 "$TMP/bf16" "${B16[@]}"
run 2 2 "$TMP/bf16_r" "${B16[@]}" --resume "$TMP/bf16/checkpoints/step_00000010"
same_sha "llama world 2, ZeRO-3, bf16, checkpointed blocks" "$TMP/bf16_r" "$TMP/bf16"

# LoRA on a Hugging Face directory: the bf16 run above, exported in fp32.
"$FDTRAIN" ckpt export "$TMP/bf16" --hf-dir "$TMP/hf" --dtype fp32 > "$TMP/export.log" 2>&1 ||
  { echo "FAIL: export"; cat "$TMP/export.log"; FAILURES=$((FAILURES+1)); }
L=("${B16[@]}" "model.init_from=$TMP/hf" "lora={r: 4, alpha: 8, targets: [q_proj, v_proj, down_proj]}")
run 2 2 "$TMP/lora" "${L[@]}"
run 2 2 "$TMP/lora_r" "${L[@]}" --resume "$TMP/lora/checkpoints/step_00000010"
same_sha "LoRA on a Hugging Face directory's base, world 2, ZeRO-3, bf16" "$TMP/lora_r" "$TMP/lora"

run 2 4 "$TMP/w2s3" zero.stage=3
check_reshard() {  # check_reshard NAME WORLD MICRO STAGE
  local name=$1 world=$2 micro=$3 stage=$4 rel
  run "$world" "$micro" "$TMP/$name" zero.stage=$stage --resume "$TMP/w2s3/checkpoints/step_00000010"
  run "$world" "$micro" "$TMP/${name}_ref" zero.stage=$stage
  rel=$("$FDTRAIN" ckpt diff "$TMP/$name/checkpoints" "$TMP/${name}_ref/checkpoints" | sed -n 's/^relative_difference //p')
  if awk -v r="$rel" 'BEGIN { exit !(r != "" && r <= 1e-5) }'; then
    echo "ok: llama world 2 stage 3 -> world $world stage $stage: ||dw||/||w|| = $rel vs the uninterrupted run"
  else
    echo "FAIL: world 2 stage 3 -> world $world stage $stage: ||dw||/||w|| = '$rel'"; FAILURES=$((FAILURES+1))
  fi
}
check_reshard w4s1 4 2 1
check_reshard w1s0 1 8 0
finish
