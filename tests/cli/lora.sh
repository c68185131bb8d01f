#!/usr/bin/env bash
# LoRA end to end on a tiny base: save and resume are bitwise (the base is not
# in the checkpoint; its SHA-256 is, and a different base is refused); the
# PEFT adapter export parses with an independent reader (tests/ckpt/read_peft.py,
# json + struct only) with PEFT's names and shapes; training continues from an
# exported adapter; a merged export loads as a plain model; bad input fails clearly.
source "$(dirname "$0")/common.bash"
R=$TMP/r.yaml
write_recipe "$R"
sed -i 's/^steps: 3/steps: 20/; s/^  n_layer: 1/  n_layer: 2/; s/^  d_model: 16/  d_model: 32/' "$R"
"$FDTRAIN" train "$R" checkpoint.every=20 --run-dir "$TMP/base" --no-progress > /dev/null 2>&1 \
  || { echo "FAIL: base run"; exit 1; }
"$FDTRAIN" ckpt export "$TMP/base" --out "$TMP/base.safetensors" > /dev/null || { echo "FAIL: export"; exit 1; }
L=(model.init_from="$TMP/base.safetensors" "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_proj]}"
   steps=30 checkpoint.every=15 --no-progress)
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }

"$FDTRAIN" train "$R" "${L[@]}" --run-dir "$TMP/lora" > "$TMP/lora.log" 2>&1 \
  || { echo "FAIL: LoRA run"; tail -5 "$TMP/lora.log"; exit 1; }
grep -q "LoRA r=4 .* 2816 trainable parameters" "$TMP/lora.log" \
  && echo "ok: the trainable parameter count is printed at start (2 blocks x 4 x ((32+96) + (32+32) + (128+32)) = 2816)" \
  || { echo "FAIL: parameter count line"; grep LoRA "$TMP/lora.log"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" train "$R" "${L[@]}" --resume "$TMP/lora/checkpoints/step_00000015" --run-dir "$TMP/lora_resumed" \
  > "$TMP/resumed.log" 2>&1 || { echo "FAIL: resume"; tail -5 "$TMP/resumed.log"; FAILURES=$((FAILURES+1)); }
[ -n "$(sha "$TMP/lora")" ] && [ "$(sha "$TMP/lora")" = "$(sha "$TMP/lora_resumed")" ] \
  && echo "ok: LoRA resume is bitwise ($(sha "$TMP/lora" | cut -c1-16))" \
  || { echo "FAIL: resume weights $(sha "$TMP/lora") vs $(sha "$TMP/lora_resumed")"; FAILURES=$((FAILURES+1)); }
# The checkpoint holds only the adapters: far smaller than the base.
ck=$(du -b "$TMP/lora/checkpoints/step_00000030/rank_00000.h5" | cut -f1)
base=$(du -b "$TMP/base.safetensors" | cut -f1)
[ "$ck" -lt "$base" ] && echo "ok: the LoRA checkpoint ($ck bytes) does not hold the base ($base bytes)" \
  || { echo "FAIL: checkpoint $ck bytes vs base $base"; FAILURES=$((FAILURES+1)); }

# A different base file is refused on resume.
cp "$TMP/base.safetensors" "$TMP/other.safetensors"
printf '\x01' | dd of="$TMP/other.safetensors" bs=1 seek=$(( $(stat -c %s "$TMP/other.safetensors") - 3 )) conv=notrunc status=none
expect_fail 2 "trained on a base with SHA-256" train "$R" model.init_from="$TMP/other.safetensors" \
  "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_proj]}" steps=30 \
  --resume "$TMP/lora/checkpoints/step_00000015" --run-dir "$TMP/other_run"

# PEFT adapter export, read by an independent reader.
"$FDTRAIN" ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter" > /dev/null \
  || { echo "FAIL: adapter export"; FAILURES=$((FAILURES+1)); }
out=$(python3 tests/ckpt/read_peft.py "$TMP/adapter" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q $'tensor\tbase_model.model.transformer.h.0.attn.c_attn.lora_A.weight\tF32\t4,32' <<<"$out" \
   && grep -q $'tensor\tbase_model.model.transformer.h.1.mlp.c_proj.lora_B.weight\tF32\t32,4' <<<"$out" \
   && grep -q $'config\tfan_in_fan_out\ttrue' <<<"$out"; then
  echo "ok: the PEFT adapter parses independently with PEFT's keys and shapes"
else
  echo "FAIL: adapter read (exit $rc)"; echo "$out" | head -8 | sed 's/^/    /'; FAILURES=$((FAILURES+1))
fi
# Training continues from the adapter: its first loss is the saved run's last one (up to the step's update).
"$FDTRAIN" train "$R" model.init_from="$TMP/base.safetensors" \
  "lora={r: 4, alpha: 8, targets: [c_attn, c_proj], adapter: $TMP/adapter}" steps=1 optimizer.lr=1e-30 \
  optimizer.weight_decay=0 checkpoint.every=1 --run-dir "$TMP/from_adapter" --no-progress > "$TMP/fa.log" 2>&1 \
  || { echo "FAIL: train from adapter"; tail -3 "$TMP/fa.log"; FAILURES=$((FAILURES+1)); }
rel=$("$FDTRAIN" ckpt diff "$TMP/from_adapter" "$TMP/lora" | sed -n 's/^relative_difference //p')
awk -v r="$rel" 'BEGIN { exit !(r != "" && r == 0) }' \
  && echo "ok: training starts from the exported adapter exactly" \
  || { echo "FAIL: from adapter: relative difference '$rel'"; FAILURES=$((FAILURES+1)); }
expect_fail 2 "lora.adapter.*r = 8" train "$R" model.init_from="$TMP/base.safetensors" \
  "lora={r: 8, targets: [c_attn, c_proj], adapter: $TMP/adapter}" --run-dir "$TMP/mismatch"

# The merged model loads as a plain GPT.
"$FDTRAIN" ckpt export "$TMP/lora" --merge-lora --out "$TMP/merged.safetensors" > /dev/null \
  || { echo "FAIL: merged export"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" train "$R" model.init_from="$TMP/merged.safetensors" steps=1 --run-dir "$TMP/merged_run" \
  --no-progress > /dev/null 2>&1 && echo "ok: the merged export trains as a plain model" \
  || { echo "FAIL: training from the merged export"; FAILURES=$((FAILURES+1)); }

# QLoRA over the same base (model.quantize: its block linears, GPT-2's Conv1D among them, in 4
# bits): save and resume are bitwise; eval and generate run on the run (the dequantized base and
# the adapters); the merged export (dequantized, fp32) evaluates to the run's own loss.
Q=(model.init_from="$TMP/base.safetensors" "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_proj]}"
   "model.quantize={type: nf4, block_size: 64}" steps=30 checkpoint.every=15 --no-progress)
"$FDTRAIN" train "$R" "${Q[@]}" --run-dir "$TMP/qlora" > "$TMP/qlora.log" 2>&1 \
  || { echo "FAIL: QLoRA run"; tail -5 "$TMP/qlora.log"; FAILURES=$((FAILURES+1)); }
grep -q "QLoRA: the blocks' base linears in 4 bits (nf4, block 64, double quant)" "$TMP/qlora.log" \
  && echo "ok: the QLoRA run says its base is in 4 bits" \
  || { echo "FAIL: QLoRA line"; grep -i qlora "$TMP/qlora.log"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" train "$R" "${Q[@]}" --resume "$TMP/qlora/checkpoints/step_00000015" --run-dir "$TMP/qlora_resumed" \
  > "$TMP/qresumed.log" 2>&1 || { echo "FAIL: QLoRA resume"; tail -5 "$TMP/qresumed.log"; FAILURES=$((FAILURES+1)); }
[ -n "$(sha "$TMP/qlora")" ] && [ "$(sha "$TMP/qlora")" = "$(sha "$TMP/qlora_resumed")" ] \
  && [ "$(sha "$TMP/qlora")" != "$(sha "$TMP/lora")" ] \
  && echo "ok: QLoRA resume is bitwise ($(sha "$TMP/qlora" | cut -c1-16), not the bf16-base run's)" \
  || { echo "FAIL: QLoRA resume weights $(sha "$TMP/qlora") vs $(sha "$TMP/qlora_resumed")"; FAILURES=$((FAILURES+1)); }
expect_fail 2 "model.quantize.type: nf4 -> fp4" train "$R" model.init_from="$TMP/base.safetensors" \
  "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_proj]}" "model.quantize={type: fp4}" steps=30 \
  --resume "$TMP/qlora/checkpoints/step_00000015" --run-dir "$TMP/qlora_other"
TEXT=/usr/share/games/fortunes/zippy
qe=$("$FDTRAIN" eval "$TMP/qlora" --data "$TEXT" --windows 4 --seq-len 16 --json 2>"$TMP/qe.err" | python3 -c 'import json,sys; print(json.load(sys.stdin)["mean_loss"])')
"$FDTRAIN" generate "$TMP/qlora" --prompt "The " --max-tokens 8 > "$TMP/qgen.txt" 2>&1 \
  && echo "ok: generate runs on the QLoRA run" || { echo "FAIL: generate on QLoRA"; tail -3 "$TMP/qgen.txt"; FAILURES=$((FAILURES+1)); }
"$FDTRAIN" ckpt export "$TMP/qlora" --merge-lora --dtype fp32 --hf-dir "$TMP/qmerged" > "$TMP/qm.log" 2>&1 \
  || { echo "FAIL: QLoRA merged export"; tail -3 "$TMP/qm.log"; FAILURES=$((FAILURES+1)); }
me=$("$FDTRAIN" eval "$TMP/qmerged" --data "$TEXT" --windows 4 --seq-len 16 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["mean_loss"])')
awk -v a="$qe" -v b="$me" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-5 * b) }' \
  && echo "ok: the QLoRA run and its merged (dequantized) export evaluate alike ($qe vs $me)" \
  || { echo "FAIL: QLoRA eval $qe vs merged $me"; cat "$TMP/qe.err" | tail -3; FAILURES=$((FAILURES+1)); }

# A NaN in a block weight of the base: quantizing it is refused naming the tensor (exit 2).
python3 - "$TMP/base.safetensors" "$TMP/nan.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
data = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
start = header["h.1.mlp.c_fc.weight"]["data_offsets"][0] + 8 + n + 4 * 5  # element 5, F32
data[start:start + 4] = struct.pack("<f", float("nan"))
open(dst, "wb").write(data)
PY
expect_fail 2 "h.1.mlp.c_fc.weight.*NaN" train "$R" model.init_from="$TMP/nan.safetensors" \
  "lora={r: 4, targets: [c_attn]}" "model.quantize={type: nf4}" --run-dir "$TMP/nan_run"

# Bad input.
expect_fail 2 "lora.targets: a gpt2 model has no layer 'qkv'; expected one of c_attn, c_proj, attn.c_proj, c_fc, mlp.c_proj, all-linear" \
  train "$R" "lora={r: 4, targets: [qkv]}" --run-dir "$TMP/bad"
expect_fail 2 "lora.r: must be >= 1" train "$R" "lora={r: 0}" --run-dir "$TMP/bad"
expect_fail 2 "model.init_from.*set model.d_model to 32" train "$R" model.d_model=64 \
  model.init_from="$TMP/base.safetensors" "lora={r: 4}" --run-dir "$TMP/bad"
finish
