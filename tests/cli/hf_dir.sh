#!/usr/bin/env bash
# Hugging Face model directories (config.json + model.safetensors) in eval,
# generate and model.init_from, on the PyTorch golden directories of
# tests/golden/llama/ (make_golden_llama.py):
#   - `fdtrain eval DIR` equals PyTorch's eval loss to 1e-5 relative, for
#     llama3 (llama3 RoPE scaling, GQA), qwen2 (q/k/v bias, tied), qwen3 (q/k
#     norm, head_dim != hidden/heads), mistral (MQA);
#   - `generate DIR` decodes with the KV cache, from the directory's BOS;
#   - full fine-tuning from a directory (ZeRO-3, mpirun -n 2) and LoRA on one;
#     the model section comes from config.json and the stored config.yaml says so;
#   - bad input: no config.json, an unsupported model_type or field, a tensor
#     missing or of the wrong shape, an index naming a missing shard, a recipe
#     key that disagrees with config.json, a LoRA target the family lacks;
#   - hostile files: config.json integers past their type or meaning, 1e999, a
#     vocab_size the embedding does not have (refused before allocating, under
#     an address-space limit), a directory or FIFO in place of a file, a tensor
#     named twice, NaN weights, a deep or escaping index.
source "$(dirname "$0")/common.bash"
GOLDEN=tests/golden/llama
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# golden NAME TENSOR: a scalar of a golden.safetensors.
golden() {
  python3 - "$GOLDEN/$1/golden.safetensors" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])[sys.argv[2]]
o = h["data_offsets"]
print(struct.unpack("<f", b[8 + n + o[0]:8 + n + o[1]])[0])
PY
}

for c in llama3 qwen2 qwen3 mistral; do
  out=$("$FDTRAIN" eval "$GOLDEN/$c" --data "$GOLDEN/$c/eval.bin" --seq-len 16 --windows 3 --json \
        2>"$TMP/eval.err") || { echo "FAIL: eval $c"; sed 's/^/    /' "$TMP/eval.err";
                                FAILURES=$((FAILURES + 1)); continue; }
  ref=$(golden "$c" eval_loss)
  if python3 -c "import json,sys; o=json.loads(sys.argv[1]); r=float(sys.argv[2]);
d=abs(o['mean_loss']-r)/r; print(f'$c: eval loss {o[\"mean_loss\"]:.8f}, PyTorch {r:.8f}, rel {d:.1e}');
sys.exit(0 if d <= 1e-5 and o['windows'] == 3 and o['targets'] == 48 else 1)" "$out" "$ref"; then
    echo "ok: $c eval equals PyTorch"
  else
    echo "FAIL: $c eval differs from PyTorch"; FAILURES=$((FAILURES + 1))
  fi
done

# generate: KV-cached decoding from the directory's BOS token (config.json bos_token_id).
out=$("$FDTRAIN" generate "$GOLDEN/llama3" --tokens 5,6,7 --max-tokens 8 --context 32 --json 2>&1) \
  && grep -q '"tokens"' <<<"$out" && echo "ok: generate on a Hugging Face directory" \
  || { echo "FAIL: generate"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }

# Training data: token ids below every golden vocabulary (83), as an llm.c .bin file.
python3 - "$TMP/tokens.bin" <<'PY'
import random, struct, sys
random.seed(3)
toks = [random.randrange(83) if i % 7 else (i // 7) % 83 for i in range(6000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack(f"<{len(toks)}H", *toks))
PY
cat > "$TMP/ft.yaml" <<YAML
model: {init_from: $GOLDEN/qwen2}
data: {format: tokens, train: [$TMP/tokens.bin], val_fraction: 0.1, seq_len: 32}
batch: {micro: 2}
optimizer: {lr: 3.0e-3}
zero: {stage: 3}
steps: 12
checkpoint: {every: 6, keep_last: 2}
logging: {every: 4, eval_batches: 1, sample_tokens: 0}
YAML
if timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$TMP/ft.yaml" \
     --run-dir "$TMP/ft" --no-progress > "$TMP/ft.log" 2>&1; then
  python3 - "$TMP/ft" <<'PY' && echo "ok: full fine-tune from a directory (ZeRO-3, 2 ranks)" \
    || { echo "FAIL: fine-tune summary/config"; FAILURES=$((FAILURES + 1)); }
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
cfg = open(sys.argv[1] + "/config.yaml").read()
assert s["status"] == "completed" and s["steps"] == 12, s
assert "arch: qwen2" in cfg and "d_ff: 64" in cfg and "tie_embeddings: true" in cfg, cfg
PY
  # Bitwise resume from the step-6 checkpoint (ZeRO-3, 2 ranks): same weights, same losses.
  timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$TMP/ft.yaml" \
    --resume "$TMP/ft/checkpoints/step_00000006" --run-dir "$TMP/ft.resumed" --no-progress \
    > "$TMP/ftr.log" 2>&1 || { echo "FAIL: resume"; tail -5 "$TMP/ftr.log"; }
  sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }
  a=$(sha "$TMP/ft"); b=$(sha "$TMP/ft.resumed")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok: resumed run's weights ${a:0:16} identical"
  else echo "FAIL: resume: weights $a vs $b"; FAILURES=$((FAILURES + 1)); fi
  "$FDTRAIN" eval "$TMP/ft" --data "$TMP/tokens.bin" --seq-len 32 --windows 2 > /dev/null 2>&1 \
    && echo "ok: eval of the fine-tuned run" || { echo "FAIL: eval of the run"; FAILURES=$((FAILURES + 1)); }
else
  echo "FAIL: fine-tune from a directory"; tail -5 "$TMP/ft.log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
fi

# LoRA on a directory: only the adapters train; the base digest covers the directory.
cp "$TMP/ft.yaml" "$TMP/lora.yaml"
sed -i "s|qwen2|llama3|; s|zero: {stage: 3}|zero: {stage: 2}\nlora: {r: 4, alpha: 8, targets: [q_proj, v_proj, down_proj]}|" "$TMP/lora.yaml"
if timeout 300 mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$TMP/lora.yaml" \
     --run-dir "$TMP/lora" --no-progress > "$TMP/lora.log" 2>&1; then
  grep -q "LoRA r=4" "$TMP/lora.log" && echo "ok: LoRA on a Hugging Face directory" \
    || { echo "FAIL: no LoRA line"; FAILURES=$((FAILURES + 1)); }
  # The merged export (a Hugging Face directory, fp32) evaluates to the run's loss.
  "$FDTRAIN" ckpt export "$TMP/lora" --merge-lora --hf-dir "$TMP/merged" --dtype fp32 > /dev/null \
    || { echo "FAIL: merged export"; FAILURES=$((FAILURES + 1)); }
  a=$("$FDTRAIN" eval "$TMP/lora" --data "$TMP/tokens.bin" --seq-len 32 --windows 8 --json 2>/dev/null)
  b=$("$FDTRAIN" eval "$TMP/merged" --data "$TMP/tokens.bin" --seq-len 32 --windows 8 --json 2>/dev/null)
  if python3 -c "import json,sys; a=json.loads(sys.argv[1])['mean_loss']; b=json.loads(sys.argv[2])['mean_loss'];
print(f'run {a:.9f}, merged directory {b:.9f}'); sys.exit(0 if abs(a-b) <= 1e-6*abs(a) else 1)" "$a" "$b"; then
    echo "ok: the merged Hugging Face directory evaluates to the LoRA run's loss"
  else
    echo "FAIL: merged export vs run"; FAILURES=$((FAILURES + 1))
  fi
else
  echo "FAIL: LoRA on a directory"; tail -5 "$TMP/lora.log" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
fi

# An export never replaces the base a run's checkpoints depend on (a copy: this must not delete).
cp -r "$GOLDEN/llama3" "$TMP/base3"
if "$FDTRAIN" train "$TMP/lora.yaml" "model.init_from=$TMP/base3" steps=2 checkpoint.every=2 \
     --run-dir "$TMP/lora3" --no-progress > "$TMP/lora3.log" 2>&1; then
  expect_fail 2 "it holds the run's base model \(model.init_from" \
    ckpt export "$TMP/lora3" --merge-lora --hf-dir "$TMP/base3" --overwrite
  cmp -s "$TMP/base3/model.safetensors" "$GOLDEN/llama3/model.safetensors" \
    && echo "ok: the base is untouched" || { echo "FAIL: the base changed"; FAILURES=$((FAILURES + 1)); }
else
  echo "FAIL: LoRA run on a copy"; tail -5 "$TMP/lora3.log"; FAILURES=$((FAILURES + 1))
fi

# Bad input. Each case edits a copy of the llama3 directory.
bad() { rm -rf "$TMP/bad"; cp -r "$GOLDEN/llama3" "$TMP/bad"; }
E="--data $GOLDEN/llama3/eval.bin --seq-len 16"
bad; rm "$TMP/bad/config.json"
expect_fail 2 "model.init_from: .*config.json" train "$TMP/ft.yaml" "model.init_from=$TMP/bad" \
  --run-dir "$TMP/x"
bad; sed -i 's/"model_type": "llama"/"model_type": "gemma"/' "$TMP/bad/config.json"
expect_fail 2 "model_type.*gemma" eval "$TMP/bad" $E
bad; sed -i 's/"hidden_act": "silu"/"hidden_act": "relu"/' "$TMP/bad/config.json"
expect_fail 2 "hidden_act.*relu" eval "$TMP/bad" $E
bad; sed -i 's/"intermediate_size": 88/"intermediate_size": 64/' "$TMP/bad/config.json"
expect_fail 2 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape \(88, 32\) in the files but \(64, 32\)" \
  eval "$TMP/bad" $E
bad; python3 - "$TMP/bad/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); del h["model.norm.weight"]
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
PY
expect_fail 2 "has no tensor 'model.norm.weight' of shape \(32,\)" eval "$TMP/bad" $E
bad; mv "$TMP/bad/model.safetensors" "$TMP/bad/model-00001-of-00002.safetensors"
echo '{"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}' \
  > "$TMP/bad/model.safetensors.index.json"
expect_fail 2 "model-00002-of-00002.safetensors" eval "$TMP/bad" $E
bad; sed -i 's/"max_position_embeddings": 64/"max_position_embeddings": 131072/' "$TMP/bad/config.json"
expect_fail 2 "context is 131072 positions; give --context" generate "$TMP/bad" --tokens 1
expect_fail 2 "context is 131072 positions; give --seq-len" eval "$TMP/bad" --data "$GOLDEN/llama3/eval.bin"
expect_fail 2 "model.n_layer: is 3 but .*config.json says 2; leave it out" \
  train "$TMP/ft.yaml" "model.init_from=$GOLDEN/llama3" model.n_layer=3 --run-dir "$TMP/x"
expect_fail 2 "a llama model has no layer 'c_attn'" \
  train "$TMP/lora.yaml" "lora.targets=[c_attn]" --run-dir "$TMP/x"
# --- Hostile model files (issue 35). Every integer of config.json is checked to fit its type and
# its meaning before use (2^32 + 2 layers are not 2), with the file, the field and the range.
setcfg() {  # setcfg KEY JSON_TEXT: sets KEY of $TMP/bad/config.json to TEXT as written (1e999)
  python3 - "$TMP/bad/config.json" "$1" "$2" <<'PY'
import json, sys
p, key, value = sys.argv[1:]
c = json.load(open(p))
assert key in c, key
c[key] = "@@value@@"
open(p, "w").write(json.dumps(c, indent=2).replace('"@@value@@"', value))
PY
}
for kv in num_hidden_layers=4294967298 num_attention_heads=4294967300 \
          max_position_embeddings=4294967360 max_position_embeddings=1000000000000 \
          vocab_size=1000000000000 num_key_value_heads=18446744073709551615; do
  bad; setcfg "${kv%%=*}" "${kv#*=}"
  expect_fail 2 "$TMP/bad/config.json: ${kv%%=*} = ${kv#*=}: expected an integer in \[" eval "$TMP/bad" $E
done
bad; setcfg num_hidden_layers 4294967298
expect_fail 2 "config.json: num_hidden_layers = 4294967298: expected an integer in \[1, 4096\]" \
  generate "$TMP/bad" --tokens 1
expect_fail 2 "model.init_from: .*config.json: num_hidden_layers = 4294967298: expected an integer" \
  train "$TMP/ft.yaml" "model.init_from=$TMP/bad" --run-dir "$TMP/x_layers"
bad; setcfg eos_token_id "[2, 1099511627776]"
expect_fail 2 "config.json: eos_token_id = 1099511627776: expected an integer in \[0, 96\]" \
  generate "$TMP/bad" --tokens 1
bad; setcfg rope_theta 1e999
out=$("$FDTRAIN" eval "$TMP/bad" $E 2>&1); rc=$?
if [[ $rc -eq 2 ]] && grep -q "$TMP/bad/config.json: .*1e999" <<<"$out" && ! grep -q "json.exception" <<<"$out"; then
  echo "ok: rope_theta 1e999: a clean error naming the file"
else echo "FAIL: rope_theta 1e999 (exit $rc)"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
# Sizes that imply an allocation are checked against the weights' headers before allocating:
# vocab_size 50,000,000 would be 6.4 GB per matrix; under a 3 GB address-space limit the
# refusal must come first, naming the tensor (not "out of memory").
bad; setcfg vocab_size 50000000
# (train at ZeRO stage 0, where the whole model is allocated at once).
for cmd in "eval $TMP/bad $E" "train $TMP/ft.yaml model.init_from=$TMP/bad zero.stage=0 --run-dir $TMP/x_vocab"; do
  # shellcheck disable=SC2086
  out=$(ulimit -v 3000000; "$FDTRAIN" $cmd 2>&1); rc=$?
  if [[ $rc -eq 2 ]] && grep -q "tensor 'model.embed_tokens.weight' has shape (97, 32) in the files but (50000000, 32)" <<<"$out"; then
    echo "ok: ${cmd%% *}: vocab_size 50000000 refused against the embedding before allocating"
  else echo "FAIL: ${cmd%% *} with vocab_size 50000000 (exit $rc)"; echo "$out" | tail -3 | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
done
# Not regular files: named as what they are, without blocking.
bad; rm "$TMP/bad/config.json"; mkdir "$TMP/bad/config.json"
expect_fail 2 "$TMP/bad/config.json: is a directory, not a regular file" eval "$TMP/bad" $E
bad; rm "$TMP/bad/model.safetensors"; mkfifo "$TMP/bad/model.safetensors"
expect_fail 2 "$TMP/bad/model.safetensors: is a FIFO, not a regular file" eval "$TMP/bad" $E
# A header naming a tensor twice (the last copy would silently win) is refused: the second
# model.norm.weight holds other bytes, appended to the data.
bad; python3 - "$TMP/bad/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
text = b[8:8 + n].decode().rstrip()
data = b[8 + n:]
dup = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [32],
                                        "data_offsets": [len(data), len(data) + 128]}})[1:-1]
hb = (text[:-1] + ", " + dup + "}").encode(); hb += b" " * (-len(hb) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + data + struct.pack("<32f", *([0.5] * 32)))
PY
expect_fail 2 "model.safetensors: the header names tensor \"model.norm.weight\" twice" eval "$TMP/bad" $E
# NaN weights: refused when loaded, naming the tensor and the file (generate, eval, init_from).
bad; python3 - "$TMP/bad/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
o = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"][0] + 8 + n + 4 * 3
b[o:o + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(b)
PY
expect_fail 2 "$TMP/bad/model.safetensors: tensor 'model.norm.weight' holds NaN at element 3 \(of 32\)" \
  generate "$TMP/bad" --tokens 1
expect_fail 2 "model.init_from: $TMP/bad/model.safetensors: tensor 'model.norm.weight' holds NaN" \
  train "$TMP/ft.yaml" "model.init_from=$TMP/bad" --run-dir "$TMP/x_nan"
# The sharded index: read with a size and depth limit, its shard names plain files of the directory.
index_case() {  # index_case TEXT: model.safetensors becomes a shard listed by an index of TEXT
  bad; mv "$TMP/bad/model.safetensors" "$TMP/bad/model-00001-of-00001.safetensors"
  printf '%s' "$1" > "$TMP/bad/model.safetensors.index.json"
}
index_case "$(python3 -c 'print("{\"weight_map\": " + "[" * 100000 + "]" * 100000 + "}")')"
expect_fail 2 "model.safetensors.index.json: arrays and objects nested deeper than 8 levels" eval "$TMP/bad" $E
for f in ../llama3/model.safetensors /etc/passwd sub/model.safetensors; do
  index_case "{\"weight_map\": {\"model.norm.weight\": \"$f\"}}"
  expect_fail 2 "weight_map entry for \"model.norm.weight\" names \"$f\", not a file in the model directory" \
    eval "$TMP/bad" $E
done
index_case '{}'; rm "$TMP/bad/model.safetensors.index.json"; mkdir "$TMP/bad/model.safetensors.index.json"
expect_fail 2 "model.safetensors.index.json: is a directory, not a regular file" eval "$TMP/bad" $E
ls -d "$TMP"/x_* > /dev/null 2>&1 && { echo "FAIL: a refused train left $(ls -d "$TMP"/x_*)"
  FAILURES=$((FAILURES + 1)); } || echo "ok: no refused train left a run directory"
finish
