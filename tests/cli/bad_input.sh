#!/usr/bin/env bash
# Every way a user can get a recipe or its data wrong ends in exit 2 and one
# clear message naming file:line:col (where a file is involved) and the key.
source "$(dirname "$0")/common.bash"

R=$TMP/r.yaml

# Unknown key, with the nearest valid key suggested (line 15 is `  lr:`).
write_recipe "$R"; sed -i 's/^  lr: 1.0e-3/  lrr: 1.0e-3/' "$R"
expect_fail 2 "$R:15:3: optimizer.lrr: unknown key; did you mean 'lr'\\?" train "$R" --run-dir "$TMP/run"

# Wrong type.
write_recipe "$R"; sed -i 's/^  micro: 2/  micro: lots/' "$R"
expect_fail 2 "$R:13:10: batch.micro: expected an integer" train "$R" --run-dir "$TMP/run"

# Out-of-range value.
write_recipe "$R"; sed -i 's/^  lr: 1.0e-3/  lr: -1/' "$R"
expect_fail 2 "$R:15:7: optimizer.lr: must be > 0" train "$R" --run-dir "$TMP/run"

# Missing data file.
write_recipe "$R"; sed -i 's#/usr/share/games/fortunes/fortunes#no/such/file.txt#' "$R"
expect_fail 2 "$R:9:11: data.train.*no/such/file.txt" train "$R" --run-dir "$TMP/run"

# Bad token-file header (all zeros: magic 0), reported at the recipe entry.
head -c 2048 /dev/zero > "$TMP/bad.bin"
write_recipe "$R"; sed -i "s#format: text#format: tokens#; s#/usr/share/games/fortunes/fortunes#$TMP/bad.bin#" "$R"
expect_fail 2 "$R:9:11: data.train\\[0\\]: .*bad.bin.*magic" train "$R" --run-dir "$TMP/run"

# Truncated token file: valid header claiming more tokens than the file holds.
printf '\x88\xd8\x34\x01\x01\x00\x00\x00\xe8\x03\x00\x00' > "$TMP/short.bin"
head -c 1012 /dev/zero >> "$TMP/short.bin"; head -c 100 /dev/zero >> "$TMP/short.bin"
write_recipe "$R"; sed -i "s#format: text#format: tokens#; s#/usr/share/games/fortunes/fortunes#$TMP/short.bin#" "$R"
expect_fail 2 "data.train\\[0\\]: .*short.bin.*1000 tokens" train "$R" --run-dir "$TMP/run"

# A number beyond its type is out of range (not a type error), in the recipe and as an override.
write_recipe "$R"; sed -i 's/^steps: 3/steps: 99999999999999999999/' "$R"
expect_fail 2 "$R:16:8: steps: 99999999999999999999 is out of range for an integer \(at most 9223372036854775807\)" \
  train "$R" --run-dir "$TMP/run"
write_recipe "$R"; sed -i 's/^  lr: 1.0e-3/  lr: 1e400/' "$R"
expect_fail 2 "$R:15:7: optimizer.lr: 1e400 is out of range for a number" validate "$R"
write_recipe "$R"
expect_fail 2 "override 'steps=99999999999999999999': steps: 99999999999999999999 is out of range for an integer" \
  train "$R" steps=99999999999999999999 --run-dir "$TMP/run"
expect_fail 2 "override 'optimizer.lr=1e400': optimizer.lr: 1e400 is out of range for a number" \
  train "$R" optimizer.lr=1e400 --run-dir "$TMP/run"

# A tab in the indentation (yaml-cpp: "illegal map value").
write_recipe "$R"; sed -i 's/^  micro: 2/\tmicro: 2/' "$R"
expect_fail 2 "$R:13:1: YAML forbids tabs for indentation; indent this line with spaces" \
  train "$R" --run-dir "$TMP/run"

# A data path that is not a regular file says what it is.
mkfifo "$TMP/fifo"; mkdir -p "$TMP/adir"
for spec in "/dev/zero|a character device" "$TMP/fifo|a FIFO" "$TMP/adir|a directory"; do
  path=${spec%|*}; what=${spec#*|}
  write_recipe "$R"; sed -i "s#/usr/share/games/fortunes/fortunes#$path#" "$R"
  expect_fail 2 "$R:9:11: data.train: '$path' is $what, not a regular file" train "$R" --run-dir "$TMP/run"
done

# A recipe (or an included fragment) that is not a regular file is refused by
# name, never opened: a FIFO would block, /dev/zero would be read without end.
for spec in "/dev/zero|a character device" "$TMP/fifo|a FIFO"; do
  path=${spec%|*}; what=${spec#*|}
  expect_fail 2 "$path: is $what, not a regular file" validate "$path"
  write_recipe "$R"; printf 'include: [%s]\n' "$path" >> "$R"
  expect_fail 2 "is $what, not a regular file" validate "$R"
done

# threads is bounded.
write_recipe "$R"
expect_fail 2 "override 'threads=100000': threads: must be in \[1, 1024\], got 100000" validate "$R" threads=100000

# Sequence longer than the model's context.
write_recipe "$R"; sed -i 's/^  seq_len: 16/  seq_len: 64/' "$R"
expect_fail 2 "$R:11:12: data.seq_len: 64 is longer than the model's context" train "$R" --run-dir "$TMP/run"

# Override of an unknown key.
write_recipe "$R"
expect_fail 2 "override 'optimizer.lrr=1e-3': optimizer.lrr: unknown key; did you mean 'lr'\\?" \
  train "$R" optimizer.lrr=1e-3 --run-dir "$TMP/run"

# device: cuda where no GPU is usable (this machine, or a build without CUDA):
# one clear message before anything is written.
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail 1 "device: cuda requested, but" train "$R" device=cuda --run-dir "$TMP/cuda_run"
  if [[ -e "$TMP/cuda_run" ]]; then
    echo "FAIL: a refused device=cuda run created its run directory"; FAILURES=$((FAILURES + 1))
  fi
fi
expect_fail 2 "lora.targets.*c_atn.*did you mean 'c_attn'" train "$R" "lora={r: 4, targets: [c_atn]}" --run-dir "$TMP/run"
expect_fail 2 "lora.r: must be >= 1" train "$R" "lora={r: 0}" --run-dir "$TMP/run"

# QLoRA's model.quantize: a bitsandbytes block size, a lora section, no parameter offload, the
# CPU for now; each refusal says what to do.
write_recipe "$R"; sed -i 's/^  max_seq_len: 32/&\n  quantize: {type: nf4}/' "$R"
expect_fail 2 "$R:7:13: model.quantize: the 4-bit base is frozen: QLoRA trains adapters over it; add a lora section" \
  validate "$R"
expect_fail 2 "$R:7:13: model.quantize: the 4-bit base is frozen" train "$R" --run-dir "$TMP/run"
expect_fail 2 "override 'model.quantize.block_size=100': model.quantize.block_size: 100 is not a block size of bitsandbytes' 4-bit kernels; use one of 32, 64, 128, 256, 512, 1024, 2048, 4096" \
  validate "$R" "lora={r: 4}" model.quantize.block_size=100
expect_fail 2 "zero.offload_params.device: nvme with model.quantize: parameter offload of a 4-bit base is not supported; .*offload the adapters' optimizer state \(zero.offload_optimizer\), which is supported" \
  validate "$R" "lora={r: 4}" \
  "zero={stage: 3, offload_optimizer: {device: nvme, path: $TMP}, offload_params: {device: nvme}}"
# device: cuda with model.quantize is a valid recipe (the 4-bit base dequantizes on the GPU).
"$FDTRAIN" validate "$R" "lora={r: 4}" device=cuda > /dev/null 2>&1 \
  && echo "ok: model.quantize with device cuda validates" \
  || { echo "FAIL: model.quantize with device cuda refused"; FAILURES=$((FAILURES + 1)); }

# A Hugging Face 4-bit directory (transformers' bitsandbytes load_in_4bit) as model.init_from:
# the golden llama3 config.json with the quantization_config of tests/ckpt/bnb4bit_python/nf4_dq
# (nf4, double quantization). The recipe must train LoRA over it and state its quantization.
mkdir -p "$TMP/bnb4"
python3 - tests/golden/llama/llama3/config.json tests/ckpt/bnb4bit_python/nf4_dq/config.json \
  "$TMP/bnb4/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"] = json.load(open(sys.argv[2]))["quantization_config"]
json.dump(c, open(sys.argv[3], "w"), indent=2)
PY
R4=$TMP/qlora.yaml
cat > "$R4" <<YAML
model:
  init_from: $TMP/bnb4
data:
  format: tokens
  train: [/usr/share/games/fortunes/fortunes]
  seq_len: 16
steps: 1
YAML
expect_fail 2 "$R4:2:14: model.init_from: $TMP/bnb4 is a 4-bit \(bitsandbytes\) model directory: its base can only be trained with LoRA adapters over it \(QLoRA\); add a lora section" \
  validate "$R4"
expect_fail 2 "$R4:2:14: model.init_from: .* add to the model section .quantize: \{type: nf4, double_quant: true\}. \(as its config.json.s quantization_config says; block_size is the weights. own, checked when they are loaded\)" \
  validate "$R4" "lora={r: 4}"
expect_fail 2 "model.quantize.type: is fp4 but $TMP/bnb4/config.json's quantization_config says bnb_4bit_quant_type nf4" \
  validate "$R4" "lora={r: 4}" "model.quantize={type: fp4}"
out=$("$FDTRAIN" print-config "$R4" "lora={r: 4}" "model.quantize={type: nf4, double_quant: true}" 2>&1)
if grep -q "^  quantize:$" <<<"$out" && grep -q "^    type: nf4$" <<<"$out" && grep -q "^  n_layer: 2$" <<<"$out"; then
  echo "ok: a 4-bit directory with lora and the same model.quantize loads"
else
  echo "FAIL: a 4-bit directory with lora and model.quantize"; echo "$out" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
fi
sed -i 's/"load_in_4bit": true/"load_in_4bit": false/; s/"_load_in_4bit": true/"_load_in_4bit": false/; s/"load_in_8bit": false/"load_in_8bit": true/; s/"_load_in_8bit": false/"_load_in_8bit": true/' \
  "$TMP/bnb4/config.json"
expect_fail 2 "model.init_from: $TMP/bnb4/config.json: quantization_config says load_in_8bit \(bitsandbytes LLM.int8\(\)\): 8-bit weights cannot be read" \
  validate "$R4" "lora={r: 4}" "model.quantize={}"
# eval reads a bitsandbytes 4-bit directory (dequantized: tests/cli/qlora.sh) and refuses 8-bit by name.
expect_fail 2 "$TMP/bnb4/config.json: quantization_config says load_in_8bit \(bitsandbytes LLM.int8\(\)\): 8-bit weights cannot be read" \
  eval "$TMP/bnb4" --data tests/golden/llama/llama3/eval.bin --seq-len 16

# validate reports every error at once.
write_recipe "$R"; sed -i 's/^  lr: 1.0e-3/  lrr: 1.0e-3/; s/^  micro: 2/  micro: 0/' "$R"
expect_fail 2 "2 errors in" validate "$R"
expect_fail 2 "batch.micro: must be >= 1, got 0" validate "$R"

# validate opens the data files as train does: what train refuses, validate refuses with the
# same message (an empty file; too few tokens for seq_len + 1; a val_fraction split too short).
: > "$TMP/empty.txt"
head -c 10 /usr/share/games/fortunes/fortunes > "$TMP/ten.txt"
head -c 30 /usr/share/games/fortunes/fortunes > "$TMP/thirty.txt"
for spec in "empty.txt||$R:9:11: data.train\[0\]: .*empty.txt: empty file" \
            "ten.txt||$R:7:1: data: the training split holds 10 tokens, fewer than seq_len \+ 1 = 17" \
            "thirty.txt|data.val_fraction=0.2|$R:7:1: data: the validation split holds 6 tokens"; do
  IFS='|' read -r file override pattern <<<"$spec"
  write_recipe "$R"; sed -i "s#/usr/share/games/fortunes/fortunes#$TMP/$file#" "$R"
  expect_fail 2 "$pattern" validate "$R" $override
  v=$("$FDTRAIN" validate "$R" $override 2>&1 | grep 'fdtrain: error')
  t=$("$FDTRAIN" train "$R" $override --run-dir "$TMP/run_$file" 2>&1 | grep 'fdtrain: error')
  if [ -z "$v" ] || [ "$v" != "$t" ]; then
    echo "FAIL: validate and train differ on $file:"; echo "    validate: $v"; echo "    train:    $t"
    FAILURES=$((FAILURES + 1))
  else
    echo "ok: validate and train give the same message for $file"
  fi
done

# A warmup longer than the run is a warning: validate says ok, train runs; both print it.
write_recipe "$R"; printf 'schedule:\n  warmup_steps: 500\n' >> "$R"
warning="fdtrain: warning: $R:21:17: schedule.warmup_steps: 500 is more than steps \(3\): the learning rate never reaches its peak"
# expect_warning ARGS...: fdtrain ARGS exits 0 and prints $warning exactly once.
expect_warning() {
  local out rc
  out=$("$FDTRAIN" "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] || [ "$(grep -Ec "^$warning\$" <<<"$out")" -ne 1 ]; then
    echo "FAIL: fdtrain $*: exit $rc, expected 0 and one warning /$warning/"
    echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1))
  else
    echo "ok: fdtrain $1 warns once and carries on"
  fi
}
expect_warning validate "$R"
expect_warning train "$R" --run-dir "$TMP/warm" --no-progress

# Missing recipe file; unknown command-line flag.
expect_fail 2 "no/such/recipe.yaml.*not found" train no/such/recipe.yaml
expect_fail 2 "fdtrain --help" train "$R" --no-such-flag

# A global batch that does not fit the world size.
write_recipe "$R"
expect_fail 2 "batch.global" train "$R" batch.global=6 --run-dir "$TMP/run"

# An existing run is not overwritten without --overwrite; the first run's files survive.
write_recipe "$R"
"$FDTRAIN" train "$R" --run-dir "$TMP/done" --no-progress >/dev/null 2>&1 || { echo "FAIL: reference run"; FAILURES=$((FAILURES+1)); }
sum_before=$(md5sum "$TMP/done/summary.json")
expect_fail 2 "already holds a finished run.*Pass --overwrite" train "$R" --run-dir "$TMP/done"
[ "$(md5sum "$TMP/done/summary.json")" = "$sum_before" ] || { echo "FAIL: summary.json changed"; FAILURES=$((FAILURES+1)); }

# A global batch that does not fit the world size, under mpirun -n 2: every rank
# agrees, exits 2, one message with the arithmetic; nothing hangs.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(timeout 120 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" batch.global=6 \
      --run-dir "$TMP/mpi" 2>&1); rc=$?
if [ $rc -ne 2 ] || ! grep -q "batch.global" <<<"$out" || [ "$(grep -c 'fdtrain: error' <<<"$out")" -ne 1 ]; then
  echo "FAIL: mpirun -n 2 with a global batch that does not fit gave exit $rc"; echo "$out" | sed 's/^/    /'
  FAILURES=$((FAILURES+1))
else
  echo "ok: mpirun -n 2, batch.global=6 refused with exit 2 and one message"
fi

# A run directory that already holds a run is seen by rank 0 only; every rank still exits 2.
out=$(timeout 120 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" --run-dir "$TMP/done" 2>&1); rc=$?
if [ $rc -ne 2 ] || ! grep -q "already holds a finished run" <<<"$out"; then
  echo "FAIL: mpirun -n 2 into an existing run gave exit $rc"; echo "$out" | sed 's/^/    /'
  FAILURES=$((FAILURES+1))
else
  echo "ok: mpirun -n 2 into an existing run refused with exit 2"
fi

finish
