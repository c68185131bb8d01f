#!/usr/bin/env bash
# QLoRA end to end on the tiny Llama 4-bit directory of make_bnb4bit_model
# (tests/engine/bnb4bit_model_fixture.h: NF4, blocks of 64, double
# quantization) and its dequantized fp32 twin:
#   - LoRA over the 4-bit directory (model.quantize) and plain LoRA over the
#     twin start from the same loss (1e-5 relative), `fdtrain eval` of the
#     4-bit directory (dequantized) equals the twin's, and greedy `generate`
#     decodes the same tokens;
#   - `fdtrain eval` of the QLoRA checkpoint reproduces the trainer's eval loss;
#   - `ckpt export --hf-dir --quantized` writes the base back byte for byte
#     (model.safetensors and config.json; a sharded FP4 directory's shards and
#     index too); a base quantized at load (fp32 and bf16 runs) exports as the
#     4-bit base the run held: training over the export starts from the same
#     loss, bit for bit;
#   - `--merge-lora --hf-dir` says the base was dequantized, and the merged
#     directory evaluates to the run's eval loss; a bf16 run over a base
#     quantized at load merges into (and `fdtrain eval` of it uses) the base
#     it held (bf16-rounded values quantized), not one quantized from fp32;
#   - GPT-2 (Conv1D weights stored [out, in] as transformers quantizes them):
#     the --quantized export evaluates as the run and trains the same weights;
#   - hostile input, each one exit 2 with one clear line: no lora section, a
#     truncated model.safetensors, a blob whose shape disagrees with config.json,
#     an unknown quant type in a blob, a model.quantize.block_size the weights do
#     not have, a resume with another model.quantize.type, --quantized on a
#     plain LoRA run or with --merge-lora, --merge-lora --out FILE of a QLoRA
#     run (it would merge into the base file, not the 4-bit base trained over).
source "$(dirname "$0")/common.bash"
MAKE=$(dirname "$FDTRAIN")/make_bnb4bit_model
[ -x "$MAKE" ] || { echo "FAIL: $MAKE not built (cmake --build build --target make_bnb4bit_model)"; exit 1; }
"$MAKE" "$TMP/q4" --twin "$TMP/twin" || { echo "FAIL: make_bnb4bit_model"; exit 1; }

# Token ids below the fixture's vocabulary (96), as llm.c .bin files; the validation file holds
# exactly one window (seq_len 16 + 1), so the trainer's eval loss is that window's.
python3 - "$TMP/train.bin" "$TMP/val.bin" <<'PY'
import random, struct, sys
def write(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
random.seed(5)
write(sys.argv[1], [random.randrange(96) for _ in range(4000)])
write(sys.argv[2], [random.randrange(96) for _ in range(17)])
PY
R=$TMP/qlora.yaml
cat > "$R" <<YAML
model:
  init_from: $TMP/q4
  quantize: {type: nf4, block_size: 64, double_quant: true}
data: {format: tokens, train: [$TMP/train.bin], val: [$TMP/val.bin], seq_len: 16}
batch: {micro: 2}
optimizer: {lr: 1.0e-2}
lora: {r: 4, alpha: 8, dropout: 0.0, targets: [all-linear]}
steps: 3
checkpoint: {every: 1}
logging: {every: 1, eval_batches: 1, sample_tokens: 0}
YAML
E=(--data "$TMP/val.bin" --seq-len 16 --windows 1 --json)

# rel_close A B TOL LABEL: |A - B| <= TOL |B|.
rel_close() {
  if python3 -c "import sys; a, b, t = map(float, sys.argv[1:4]); d = abs(a - b) / abs(b)
print(f'    {sys.argv[4]}: {a:.9f} vs {b:.9f}, relative {d:.1e}'); sys.exit(0 if d <= t else 1)" "$@"; then
    echo "ok: $4 within $3"
  else
    echo "FAIL: $4 differs by more than $3"; FAILURES=$((FAILURES + 1))
  fi
}
first_loss() { python3 -c "import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if 'loss' in j: print(j['loss']); break" "$1/metrics.jsonl"; }
mean_loss() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['mean_loss'])" "$1"; }

# QLoRA over the 4-bit directory vs plain LoRA over its dequantized twin (fp32 both).
"$FDTRAIN" train "$R" --run-dir "$TMP/qrun" --no-progress > "$TMP/qrun.log" 2>&1 \
  || { echo "FAIL: QLoRA run"; tail -5 "$TMP/qrun.log"; exit 1; }
"$FDTRAIN" train "$R" model.init_from="$TMP/twin" model.quantize=null --run-dir "$TMP/trun" \
  --no-progress > "$TMP/trun.log" 2>&1 || { echo "FAIL: LoRA run on the twin"; tail -5 "$TMP/trun.log"; exit 1; }
rel_close "$(first_loss "$TMP/qrun")" "$(first_loss "$TMP/trun")" 1e-5 \
  "first loss, QLoRA over the 4-bit directory vs LoRA over the twin"

# eval of the 4-bit directory (dequantized) vs the twin.
q=$("$FDTRAIN" eval "$TMP/q4" "${E[@]}" 2>"$TMP/q4.err") || { echo "FAIL: eval of the 4-bit dir"; cat "$TMP/q4.err"; exit 1; }
t=$("$FDTRAIN" eval "$TMP/twin" "${E[@]}" 2>/dev/null) || { echo "FAIL: eval of the twin"; exit 1; }
rel_close "$(mean_loss "$q")" "$(mean_loss "$t")" 1e-5 "fdtrain eval, 4-bit directory vs twin"
grep -q "4-bit directory.*dequantized" "$TMP/q4.err" && echo "ok: eval says the 4-bit weights are dequantized" \
  || { echo "FAIL: no dequantized note"; sed 's/^/    /' "$TMP/q4.err"; FAILURES=$((FAILURES + 1)); }

# generate (greedy) on the 4-bit directory decodes the twin's tokens.
gen() { "$FDTRAIN" generate "$1" --tokens 5,6,7 --max-tokens 8 --temperature 0 --json 2>/dev/null \
  | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'])"; }
a=$(gen "$TMP/q4"); b=$(gen "$TMP/twin")
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok: generate on the 4-bit directory decodes the twin's tokens $a" \
  || { echo "FAIL: generate: '$a' vs the twin's '$b'"; FAILURES=$((FAILURES + 1)); }

# --quantized: the base back as a 4-bit directory, byte for byte. A bf16 run: config.json's
# torch_dtype and bnb_4bit_compute_dtype are the run's compute dtype, as the fixture's.
"$FDTRAIN" train "$R" precision=bf16 steps=1 --run-dir "$TMP/brun" --no-progress > "$TMP/brun.log" 2>&1 \
  || { echo "FAIL: bf16 QLoRA run"; tail -5 "$TMP/brun.log"; exit 1; }
out=$("$FDTRAIN" ckpt export "$TMP/brun" --hf-dir "$TMP/back" --quantized 2>&1) \
  || { echo "FAIL: export --quantized"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }
grep -q "not merged.*--lora-adapter" <<<"$out" && echo "ok: --quantized says the adapters are not merged" \
  || { echo "FAIL: --quantized message"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }
for f in model.safetensors config.json; do
  cmp -s "$TMP/q4/$f" "$TMP/back/$f" && echo "ok: --quantized writes $f back byte for byte" \
    || { echo "FAIL: $f differs"; FAILURES=$((FAILURES + 1)); }
done

# The same from a sharded FP4 directory (blocks of 128, no double quantization): the shards keep
# the directory's own split, each file and the index byte for byte.
"$MAKE" "$TMP/fp4" --type fp4 --block-size 128 --double-quant 0 --max-shard-bytes 40000 \
  || { echo "FAIL: make_bnb4bit_model fp4"; exit 1; }
"$FDTRAIN" train "$R" model.init_from="$TMP/fp4" "model.quantize={type: fp4, block_size: 128, double_quant: false}" \
  precision=bf16 steps=1 --run-dir "$TMP/frun" --no-progress > "$TMP/frun.log" 2>&1 \
  || { echo "FAIL: FP4 QLoRA run"; tail -5 "$TMP/frun.log"; exit 1; }
"$FDTRAIN" ckpt export "$TMP/frun" --hf-dir "$TMP/fback" --quantized > /dev/null \
  || { echo "FAIL: export --quantized of the FP4 run"; FAILURES=$((FAILURES + 1)); }
n=$(ls "$TMP/fp4" | grep -c '^model-.*-of-.*\.safetensors$')
if [ "$n" -gt 1 ] && diff -r "$TMP/fp4" "$TMP/fback" > /dev/null; then
  echo "ok: --quantized writes a sharded FP4 directory ($n shards + index) back byte for byte"
else
  echo "FAIL: sharded FP4 round trip ($n shards)"; diff -rq "$TMP/fp4" "$TMP/fback" | sed 's/^/    /'
  FAILURES=$((FAILURES + 1))
fi

# eval of the QLoRA run's checkpoint (adapters over the 4-bit base read again) reproduces the
# trainer's final eval loss.
e=$("$FDTRAIN" eval "$TMP/qrun" "${E[@]}" 2>/dev/null) || { echo "FAIL: eval of the QLoRA run"; FAILURES=$((FAILURES + 1)); }
rel_close "$(mean_loss "$e")" "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['eval_loss'])" \
  "$TMP/qrun/summary.json")" 1e-6 "eval of the QLoRA checkpoint vs the trainer's final eval loss"

# --max-shard-size splits by size instead (the same tensors, read back as the same model).
"$FDTRAIN" ckpt export "$TMP/frun" --hf-dir "$TMP/fsplit" --quantized --max-shard-size 60000 > /dev/null \
  || { echo "FAIL: export --quantized --max-shard-size"; FAILURES=$((FAILURES + 1)); }
a=$("$FDTRAIN" eval "$TMP/fp4" "${E[@]}" 2>/dev/null); b=$("$FDTRAIN" eval "$TMP/fsplit" "${E[@]}" 2>/dev/null)
n=$(ls "$TMP/fsplit" | grep -c '^model-.*-of-.*\.safetensors$')
[ "$n" -gt 1 ] && [ "$n" -ne 3 ] && [ -n "$a" ] && [ "$(mean_loss "$a")" = "$(mean_loss "$b")" ] \
  && echo "ok: --quantized --max-shard-size 60000 writes $n shards of the same model" \
  || { echo "FAIL: --max-shard-size: $n shards, eval '$a' vs '$b'"; FAILURES=$((FAILURES + 1)); }

# --merge-lora of the fp32 QLoRA run: dequantized base + adapters, evaluating to the run's loss.
out=$("$FDTRAIN" ckpt export "$TMP/qrun" --merge-lora --hf-dir "$TMP/merged" 2>&1) \
  || { echo "FAIL: export --merge-lora"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }
grep -q "dequantized from 4 bits" <<<"$out" && echo "ok: --merge-lora says the base was dequantized" \
  || { echo "FAIL: --merge-lora message"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }
m=$("$FDTRAIN" eval "$TMP/merged" "${E[@]}" 2>/dev/null) || { echo "FAIL: eval of the merged dir"; FAILURES=$((FAILURES + 1)); }
rel_close "$(mean_loss "$m")" "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['eval_loss'])" \
  "$TMP/qrun/summary.json")" 1e-4 "merged directory's eval loss vs the QLoRA run's final eval loss"

# GPT-2: its Conv1D weights are (in, out); a 4-bit directory stores them [out, in], as transformers
# quantizes them. A QLoRA run over a GPT-2 base (adapters kept ~0 by lr 1e-30), exported with
# --quantized: eval of the export equals eval of the run, and a run over the export trains the
# same weights.
G=$TMP/gpt2.yaml
write_recipe "$G"
sed -i 's/^  d_model: 16/  d_model: 32/' "$G"
"$FDTRAIN" train "$G" --run-dir "$TMP/g_base" --no-progress > /dev/null 2>&1 \
  && "$FDTRAIN" ckpt export "$TMP/g_base" --hf-dir "$TMP/g_base.hf" > /dev/null \
  || { echo "FAIL: GPT-2 base"; exit 1; }
GQ=(model.init_from="$TMP/g_base.hf" "model.quantize={type: nf4}" "lora={r: 2, targets: [c_attn, c_fc]}"
    optimizer.lr=1e-30 optimizer.weight_decay=0 steps=2 checkpoint.every=2 --no-progress)
"$FDTRAIN" train "$G" "${GQ[@]}" --run-dir "$TMP/g_q" > "$TMP/g_q.log" 2>&1 \
  || { echo "FAIL: GPT-2 QLoRA run"; tail -5 "$TMP/g_q.log"; exit 1; }
"$FDTRAIN" ckpt export "$TMP/g_q" --hf-dir "$TMP/g_q.4bit" --quantized > /dev/null \
  || { echo "FAIL: GPT-2 export --quantized"; FAILURES=$((FAILURES + 1)); }
GE=(--data /usr/share/games/fortunes/fortunes --seq-len 16 --windows 4 --json)
a=$("$FDTRAIN" eval "$TMP/g_q" "${GE[@]}" 2>/dev/null); b=$("$FDTRAIN" eval "$TMP/g_q.4bit" "${GE[@]}" 2>/dev/null)
rel_close "$(mean_loss "$b")" "$(mean_loss "$a")" 1e-6 "GPT-2: eval of the --quantized export vs eval of the QLoRA run"
"$FDTRAIN" train "$G" "${GQ[@]}" model.init_from="$TMP/g_q.4bit" --run-dir "$TMP/g_again" > /dev/null 2>&1 \
  || { echo "FAIL: GPT-2 QLoRA over the export"; FAILURES=$((FAILURES + 1)); }
sha() { sed -n 's/^  "weights_sha256": "\([0-9a-f]*\)",*$/\1/p' "$1/summary.json"; }
[ -n "$(sha "$TMP/g_q")" ] && [ "$(sha "$TMP/g_q")" = "$(sha "$TMP/g_again")" ] \
  && echo "ok: GPT-2: a run over the --quantized export trains the same weights ($(sha "$TMP/g_q" | cut -c1-16))" \
  || { echo "FAIL: GPT-2 weights $(sha "$TMP/g_q") vs $(sha "$TMP/g_again")"; FAILURES=$((FAILURES + 1)); }

expect_fail 2 "--merge-lora --out FILE merges into the base file as it is, and this QLoRA run" \
  ckpt export "$TMP/g_q" --merge-lora --out "$TMP/g_merged.safetensors"

# Hostile input.
expect_fail 2 "is a 4-bit \(bitsandbytes\) model directory.*add a lora section" train "$R" lora=null \
  --run-dir "$TMP/x"
expect_fail 2 "stores its weights as" train "$R" model.quantize.block_size=128 --run-dir "$TMP/x"
expect_fail 2 "--quantized --merge-lora" ckpt export "$TMP/qrun" --hf-dir "$TMP/x" --quantized --merge-lora
expect_fail 2 "has no model.quantize" ckpt export "$TMP/trun" --hf-dir "$TMP/x" --quantized
# A resume with another quant type: a QLoRA run over the twin (quantized at load).
"$FDTRAIN" train "$R" model.init_from="$TMP/twin" steps=1 --run-dir "$TMP/twinq" --no-progress \
  > "$TMP/twinq.log" 2>&1 || { echo "FAIL: QLoRA run over the twin"; tail -5 "$TMP/twinq.log"; exit 1; }
# A base quantized at load (fp32 run; bf16 run, which quantizes the bf16-rounded values), exported
# with --quantized and trained over again: the same 4-bit base, so the same first loss, bit for bit.
"$FDTRAIN" train "$R" model.init_from="$TMP/twin" precision=bf16 steps=1 --run-dir "$TMP/twinb" \
  --no-progress > "$TMP/twinb.log" 2>&1 || { echo "FAIL: bf16 QLoRA run over the twin"; tail -5 "$TMP/twinb.log"; exit 1; }
for p in "twinq fp32" "twinb bf16"; do
  set -- $p
  "$FDTRAIN" ckpt export "$TMP/$1" --hf-dir "$TMP/$1.4bit" --quantized > /dev/null \
    || { echo "FAIL: export --quantized of $1"; FAILURES=$((FAILURES + 1)); }
  "$FDTRAIN" train "$R" model.init_from="$TMP/$1.4bit" precision=$2 steps=1 --run-dir "$TMP/$1.again" \
    --no-progress > "$TMP/again.log" 2>&1 || { echo "FAIL: QLoRA over $1's export"; tail -5 "$TMP/again.log"; }
  a=$(first_loss "$TMP/$1"); b=$(first_loss "$TMP/$1.again")
  [ -n "$a" ] && [ "$a" = "$b" ] && echo "ok: $2: a base quantized at load, exported and trained over again: same first loss ($a)" \
    || { echo "FAIL: $2: first loss $a over the twin vs $b over its --quantized export"; FAILURES=$((FAILURES + 1)); }
done
# --merge-lora of the bf16 run over the twin uses the base the run quantized (from bf16 values):
# the run over its --quantized export has the same base and so the same adapters, and both
# merges evaluate to the same loss, bit for bit.
for r in twinb twinb.again; do
  "$FDTRAIN" ckpt export "$TMP/$r" --merge-lora --hf-dir "$TMP/$r.merged" --dtype fp32 > /dev/null \
    || { echo "FAIL: --merge-lora of $r"; FAILURES=$((FAILURES + 1)); }
done
a=$("$FDTRAIN" eval "$TMP/twinb.merged" "${E[@]}" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['mean_loss'])")
b=$("$FDTRAIN" eval "$TMP/twinb.again.merged" "${E[@]}" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['mean_loss'])")
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok: bf16 --merge-lora over a base quantized at load merges into the base the run held ($a)" \
  || { echo "FAIL: bf16 merges: $a (base quantized at load) vs $b (its 4-bit export)"; FAILURES=$((FAILURES + 1)); }
# So does eval of its checkpoint (the base rounded to bf16, then quantized, as the run did).
a=$("$FDTRAIN" eval "$TMP/twinb" "${E[@]}" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['mean_loss'])")
b=$("$FDTRAIN" eval "$TMP/twinb.again" "${E[@]}" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['mean_loss'])")
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok: eval of a bf16 QLoRA run over a base quantized at load uses the base the run held ($a)" \
  || { echo "FAIL: bf16 evals: $a (base quantized at load) vs $b (its 4-bit export)"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "model.quantize.type: nf4 -> fp4" train "$R" model.init_from="$TMP/twin" \
  model.quantize.type=fp4 steps=2 --resume "$TMP/twinq/checkpoints/step_00000001" --run-dir "$TMP/x"

# Edited copies of the 4-bit directory, read by eval and by train.
bad() { rm -rf "$TMP/bad"; cp -r "$TMP/q4" "$TMP/bad"; }
# replace OLD NEW: the first OLD in bad/model.safetensors, same length, so nothing else moves.
replace() {
  python3 - "$TMP/bad/model.safetensors" "$1" "$2" <<'PY'
import sys
p, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
assert len(old) == len(new)
b = open(p, "rb").read()
i = b.index(old, 8 + int.from_bytes(b[:8], "little"))
open(p, "wb").write(b[:i] + new + b[i + len(old):])
PY
}
bad; truncate -s -100 "$TMP/bad/model.safetensors"
expect_fail 2 "model.safetensors: .*run past the data section.*the file is corrupt" eval "$TMP/bad" "${E[@]}"
expect_fail 2 "model.safetensors: .*run past the data section.*the file is corrupt" train "$R" \
  model.init_from="$TMP/bad" --run-dir "$TMP/x"
bad; replace '"shape": [288, 64]' '"shape": [64, 288]'
expect_fail 2 "mlp\.(gate|up)_proj\.weight.*64, 288" eval "$TMP/bad" "${E[@]}"
expect_fail 2 "mlp\.(gate|up)_proj\.weight.*64, 288" train "$R" model.init_from="$TMP/bad" --run-dir "$TMP/x"
bad; replace '"quant_type": "nf4"' '"quant_type": "nf5"'
expect_fail 2 "nf5" eval "$TMP/bad" "${E[@]}"
finish
