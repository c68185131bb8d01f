#!/usr/bin/env bash
# fdtrain tokenize: the token file holds, document by document, the tokenizer's
# BOS, exactly the ids Hugging Face's own implementation gives
# (tests/text/tokenizer/hf_reference.mjs, run live) and EOS; v1 (uint16) for
# GPT-2, v2 (uint32) for Qwen3; the same bytes with 1 and 2 threads; .jsonl
# documents; --raw. Then the errors: missing or malformed tokenizer.json
# (file:line:col), an unsupported component (by JSON path), bad .jsonl lines
# (file:line), an existing --out kept, missing inputs.
source "$(dirname "$0")/common.bash"
NPM=tests/fixtures/npm/node_modules/@lenml
CORPUS=tests/text/tokenizer/corpus
[[ -f $NPM/tokenizer-gpt2/models/tokenizer.json ]] ||
  { echo "FAIL: $NPM is missing: run scripts/install_deps.sh"; exit 1; }
# The text files (invalid_utf8.bin is refused: tokenize reads UTF-8 text; see the end).
mapfile -t INPUTS < <(ls $CORPUS/*.txt | LC_ALL=C sort -t/ -k4)

# check_file MODEL BIN JSON_OUTPUT: BIN == per document [bos] + Hugging Face's ids + [eos].
check_file() {
  local model=$1 bin=$2 summary=$3
  node tests/text/tokenizer/hf_reference.mjs --tokenizer "$NPM/tokenizer-$model/models" \
    --out "$TMP/ref.jsonl" "${INPUTS[@]}" 2>/dev/null || { echo "FAIL: hf_reference $model"; FAILURES=$((FAILURES + 1)); return; }
  if python3 - "$bin" "$summary" "$TMP/ref.jsonl" <<'PY'; then
import json, struct, sys
data = open(sys.argv[1], "rb").read()
magic, version, count = struct.unpack("<3i", data[:12])
s = json.loads(sys.argv[2])
width = 2 if version == 1 else 4
ids = list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))
assert magic == 20240520 and version == s["version"] and count == s["tokens"], (magic, version, count)
want = []
for line in open(sys.argv[3]):
    r = json.loads(line)
    if ":" in r["file"]:
        continue  # per-line cases; the whole files are the documents
    want += ([s["bos"]] if s["bos"] is not None else []) + r["ids_raw"] + ([s["eos"]] if s["eos"] is not None else [])
assert ids == want, next(i for i in range(min(len(ids), len(want))) if ids[i] != want[i]) if ids[:len(want)] != want[:len(ids)] else (len(ids), len(want))
print(f"    {count} tokens, version {version}, {s['documents']} documents")
PY
    echo "ok: $model: the token file is Hugging Face's ids with BOS/EOS per document"
  else
    echo "FAIL: $model: token file differs from Hugging Face's ids"; FAILURES=$((FAILURES + 1))
  fi
}

for model in gpt2 qwen3 llama2; do
  for t in 1 2; do
    out=$("$FDTRAIN" tokenize --tokenizer "$NPM/tokenizer-$model/models" --out "$TMP/$model.$t.bin" \
          --threads $t --json "${INPUTS[@]}") || { echo "FAIL: tokenize $model"; FAILURES=$((FAILURES + 1)); continue; }
  done
  check_file "$model" "$TMP/$model.1.bin" "$out"
  if cmp -s "$TMP/$model.1.bin" "$TMP/$model.2.bin"; then echo "ok: $model: 1 and 2 threads write the same bytes"
  else echo "FAIL: $model: 1 and 2 threads differ"; FAILURES=$((FAILURES + 1)); fi
done
python3 - "$TMP/gpt2.1.bin" "$TMP/qwen3.1.bin" <<'PY' && echo "ok: GPT-2 writes version 1 (uint16), Qwen3 version 2 (uint32)" || { echo "FAIL: versions"; FAILURES=$((FAILURES + 1)); }
import struct, sys
assert struct.unpack("<i", open(sys.argv[1], "rb").read(8)[4:])[0] == 1
assert struct.unpack("<i", open(sys.argv[2], "rb").read(8)[4:])[0] == 2
PY

# .jsonl: one document per line's "text"; blank lines skipped and counted; --raw adds nothing.
python3 - "$TMP/docs.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for t in ["Hello world.", "Second <|endoftext|> document", "", "  ", "naïve café 日本語"]:
        f.write((json.dumps({"text": t, "id": 1}) if t.strip() else t) + "\n")
PY
out=$("$FDTRAIN" tokenize --tokenizer "$NPM/tokenizer-gpt2/models" --out "$TMP/j.bin" --json "$TMP/docs.jsonl")
raw=$("$FDTRAIN" tokenize --tokenizer "$NPM/tokenizer-gpt2/models" --out "$TMP/jr.bin" --raw --json "$TMP/docs.jsonl")
if python3 - "$out" "$raw" <<'PY'; then
import json, sys
a, r = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["documents"] == 3 and a["skipped_blank_lines"] == 2, a
assert a["bos"] == 50256 and a["eos"] == 50256 and r["bos"] is None and r["eos"] is None, (a, r)
assert a["tokens"] == r["tokens"] + 6, (a["tokens"], r["tokens"])
PY
  echo "ok: .jsonl documents, blank lines counted, --raw adds no tokens"
else echo "FAIL: .jsonl / --raw"; FAILURES=$((FAILURES + 1)); fi

# Errors.
G=$NPM/tokenizer-gpt2/models
expect_fail 2 "tokenizer directory not found: $TMP/none" tokenize --tokenizer "$TMP/none" --out "$TMP/o.bin" "${INPUTS[0]}"
mkdir -p "$TMP/bad"
printf '{\n  "model": {"type": "BPE",\n    "vocab": {"a": 0,}\n  }\n}\n' > "$TMP/bad/tokenizer.json"
expect_fail 2 "$TMP/bad/tokenizer.json: line 3, column 22: not valid JSON" tokenize --tokenizer "$TMP/bad" --out "$TMP/o.bin" "${INPUTS[0]}"
python3 - "$G/tokenizer.json" "$TMP/unsup/tokenizer.json" <<'PY'
import json, os, sys
j = json.load(open(sys.argv[1]))
j["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
json.dump(j, open(sys.argv[2], "w"))
PY
expect_fail 2 'normalizer.normalizers\[1\]: the normalizer type "Lowercase" is not supported' \
  tokenize --tokenizer "$TMP/unsup" --out "$TMP/o.bin" "${INPUTS[0]}"
printf '{"text": "ok"}\n{"txt": "no field"}\n' > "$TMP/nofield.jsonl"
expect_fail 2 "nofield.jsonl:2: no string field \"text\"" tokenize --tokenizer "$G" --out "$TMP/o.bin" "$TMP/nofield.jsonl"
printf '{"text": "ok"}\n{"text": "broken\n' > "$TMP/broken.jsonl"
expect_fail 2 "broken.jsonl:2: not valid JSON" tokenize --tokenizer "$G" --out "$TMP/o.bin" "$TMP/broken.jsonl"
expect_fail 2 "input not found: $TMP/missing.txt" tokenize --tokenizer "$G" --out "$TMP/o.bin" "$TMP/missing.txt"
# An input that is not a regular file is named by what it is, never opened (a FIFO would block).
mkfifo "$TMP/in.fifo"
expect_fail 2 "input $TMP/in.fifo: is a FIFO, not a regular file" tokenize --tokenizer "$G" --out "$TMP/o.bin" "$TMP/in.fifo"
expect_fail 2 "input /dev/zero: is a character device, not a regular file" tokenize --tokenizer "$G" --out "$TMP/o.bin" /dev/zero
cp "$TMP/j.bin" "$TMP/keep.bin"
expect_fail 2 "keep.bin exists; pass --overwrite" tokenize --tokenizer "$G" --out "$TMP/keep.bin" "${INPUTS[0]}"
cmp -s "$TMP/j.bin" "$TMP/keep.bin" && echo "ok: the existing --out is untouched" || { echo "FAIL: --out changed"; FAILURES=$((FAILURES + 1)); }
expect_fail 1 "cannot create a temporary file $TMP/nodir/o.bin.tmp-" tokenize --tokenizer "$G" --out "$TMP/nodir/o.bin" "${INPUTS[0]}"
[[ -z $(ls "$TMP" | grep '\.tmp\.') ]] && echo "ok: no temporary files left" || { echo "FAIL: temporary files left"; FAILURES=$((FAILURES + 1)); }
# End to end: tokenize text with GPT-2's tokenizer, train on the token file (loss falls),
# generate text through the tokenizer; generation stops at the tokenizer's stop ids
# (generation_config.json's eos_token_id).
"$FDTRAIN" tokenize --tokenizer "$G" --out "$TMP/fort.bin" /usr/share/games/fortunes/fortunes \
  /usr/share/games/fortunes/literature > /dev/null || { echo "FAIL: tokenize fortunes"; FAILURES=$((FAILURES + 1)); }
write_recipe "$TMP/r.yaml"
"$FDTRAIN" train "$TMP/r.yaml" model.vocab_size=50257 model.d_model=32 data.format=tokens \
  "data.train=[$TMP/fort.bin]" data.seq_len=32 steps=40 logging.every=10 optimizer.lr=3e-3 \
  --run-dir "$TMP/run" --no-progress > "$TMP/train.log" 2>&1 || { echo "FAIL: train"; tail -3 "$TMP/train.log"; FAILURES=$((FAILURES + 1)); }
if python3 - "$TMP/run/metrics.jsonl" <<'PY'; then
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
assert losses[-1] < losses[0] - 2.0, losses
print(f"    loss {losses[0]:.3f} -> {losses[-1]:.3f}")
PY
  echo "ok: a model trains on text tokenized by a real tokenizer"
else echo "FAIL: loss did not fall"; FAILURES=$((FAILURES + 1)); fi
gen=$("$FDTRAIN" generate "$TMP/run" --tokenizer "$G" --prompt "The meaning of life is" \
      --temperature 1 --top-k 0 --seed 7 --max-tokens 12 --json 2>/dev/null)
mkdir -p "$TMP/tok" && cp "$G/tokenizer.json" "$G/tokenizer_config.json" "$TMP/tok/"
echo "    sampled: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$gen")"
python3 - "$gen" "$TMP/tok/generation_config.json" <<'PY'
import json, sys
g = json.loads(sys.argv[1])
assert len(g["tokens"]) == 12 and g["text"] and g["prompt_tokens"][0] == 50256, g
# The stop id: a token first drawn mid-way; generation must end right there.
t = g["tokens"]
first = next(i for i in range(len(t) // 3, len(t)) if t[i] not in t[:i])
assert first + 1 < len(t), t
json.dump({"eos_token_id": [50256, t[first]]}, open(sys.argv[2], "w"))
open(sys.argv[2] + ".want", "w").write(str(first + 1))
PY
[[ $? -eq 0 ]] && echo "ok: generate prints decoded text" || { echo "FAIL: generate text: $gen"; FAILURES=$((FAILURES + 1)); }
stopped=$("$FDTRAIN" generate "$TMP/run" --tokenizer "$TMP/tok" --prompt "The meaning of life is" \
          --temperature 1 --top-k 0 --seed 7 --max-tokens 12 --json 2>/dev/null)
python3 -c "import json,sys; g=json.loads(sys.argv[1]); assert len(g['tokens']) == int(sys.argv[2]), g['tokens']" \
  "$stopped" "$(cat "$TMP/tok/generation_config.json.want")" \
  && echo "ok: generation stops at generation_config.json's eos_token_id" \
  || { echo "FAIL: no stop at eos: $stopped"; FAILURES=$((FAILURES + 1)); }
expect_fail 2 "has 151669 ids but the model .* only 50257" generate "$TMP/run" \
  --tokenizer "$NPM/tokenizer-qwen3/models" --prompt x

# data.tokenizer: text tokenized while the run starts trains exactly as the token file does
# (the same weights), and the run's generate reads its tokenizer from the recipe.
"$FDTRAIN" train "$TMP/r.yaml" model.vocab_size=50257 model.d_model=32 data.format=text \
  "data.tokenizer=$G" "data.train=[/usr/share/games/fortunes/fortunes,/usr/share/games/fortunes/literature]" \
  data.seq_len=32 steps=40 logging.every=10 optimizer.lr=3e-3 \
  --run-dir "$TMP/run_text" --no-progress > "$TMP/train_text.log" 2>&1 || { echo "FAIL: train with data.tokenizer"; tail -3 "$TMP/train_text.log"; FAILURES=$((FAILURES + 1)); }
if python3 - "$TMP/run/summary.json" "$TMP/run_text/summary.json" <<'PY'; then
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["weights_sha256"] == b["weights_sha256"], (a["weights_sha256"], b["weights_sha256"])
print(f"    weights {a['weights_sha256'][:16]} both ways")
PY
  echo "ok: data.tokenizer trains bit-identically to fdtrain tokenize + data.format tokens"
else echo "FAIL: data.tokenizer and the token file train differently"; FAILURES=$((FAILURES + 1)); fi
text=$("$FDTRAIN" generate "$TMP/run_text" --prompt "The " --max-tokens 5 2>/dev/null) && [[ -n $text ]] \
  && echo "ok: generate takes the run's data.tokenizer" || { echo "FAIL: generate on the data.tokenizer run"; FAILURES=$((FAILURES + 1)); }
# eval reads text through the run's tokenizer as training does: the loss of the first windows of
# the text equals that of the token file's (which starts with the same document).
e_text=$("$FDTRAIN" eval "$TMP/run_text" --data /usr/share/games/fortunes/fortunes --windows 2 --json 2>/dev/null)
e_bin=$("$FDTRAIN" eval "$TMP/run_text" --data "$TMP/fort.bin" --windows 2 --json 2>/dev/null)
python3 - "$e_text" "$e_bin" "$G" <<'PY' && echo "ok: eval encodes text with the run's data.tokenizer" || { echo "FAIL: eval with a tokenizer: $e_text / $e_bin"; FAILURES=$((FAILURES + 1)); }
import json, sys
t, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert t["tokenizer"] == sys.argv[3] and "tokenizer" not in b, (t, b)
assert t["mean_loss"] == b["mean_loss"] and t["targets"] == 64, (t, b)
PY
expect_fail 2 "data.tokenizer .* has 50257 ids but model.vocab_size is 256" train "$TMP/r.yaml" \
  "data.tokenizer=$G" --run-dir "$TMP/run_small"
expect_fail 2 "data.tokenizer: a tokenizer reads text" train "$TMP/r.yaml" data.format=tokens \
  "data.train=[$TMP/fort.bin]" "data.tokenizer=$G" --run-dir "$TMP/run_tok"
expect_fail 2 "data.tokenizer: tokenizer directory not found: $TMP/none" train "$TMP/r.yaml" \
  "data.tokenizer=$TMP/none" --run-dir "$TMP/run_none"

# --- hostile input (issue 35): text that is not UTF-8, deep nesting, ids outside the range of
# an id. Each is refused (exit 2) naming the file, before any output is written.
expect_fail 2 "invalid_utf8.bin: not UTF-8 text: byte [0-9]+ \(0x[0-9A-F]{2}\) begins no valid UTF-8 sequence" \
  tokenize --tokenizer "$G" --out "$TMP/u.bin" $CORPUS/english_prose.txt $CORPUS/invalid_utf8.bin
expect_fail 2 "/usr/bin/ls: not UTF-8 text: byte [0-9]+ " tokenize --tokenizer "$G" --out "$TMP/u.bin" /usr/bin/ls
[[ ! -e $TMP/u.bin ]] && echo "ok: no token file written" || { echo "FAIL: u.bin written"; FAILURES=$((FAILURES + 1)); }
python3 - "$G" "$TMP/hostile" <<'PY'
import json, os, sys
src, out = sys.argv[1:]
j = json.load(open(f"{src}/tokenizer.json"))
def variant(name, edit=None, text=None):
    os.makedirs(f"{out}/{name}", exist_ok=True)
    v = json.loads(json.dumps(j))
    if edit: edit(v)
    open(f"{out}/{name}/tokenizer.json", "w").write(text(v) if text else json.dumps(v))
# A normalizer Sequence 50,000 deep (Python's json cannot write it: spliced in as text).
deep = '{"type": "Sequence", "normalizers": [' * 50000 + '{"type": "NFC"}' + "]}" * 50000
variant("deep", lambda v: v.update(normalizer="@@deep@@"), lambda v: json.dumps(v).replace('"@@deep@@"', deep))
variant("id31", lambda v: v["added_tokens"].append({"id": 2147483647, "content": "<big>", "special": True}))
variant("id40", lambda v: v["added_tokens"].append({"id": 2**40, "content": "<huge>", "special": True}))
variant("vocab40", lambda v: v["model"]["vocab"].update({"Hello": 2**40}))
PY
H=$TMP/hostile
expect_fail 2 "$H/deep/tokenizer.json: arrays and objects nested deeper than 128 levels" \
  tokenize --tokenizer "$H/deep" --out "$TMP/u.bin" "${INPUTS[0]}"
expect_fail 2 "$H/deep/tokenizer.json: arrays and objects nested deeper than 128 levels" \
  eval "$TMP/run" --tokenizer "$H/deep" --data /usr/share/games/fortunes/fortunes --windows 1
expect_fail 2 "added_tokens\[1\]: the added token \"<big>\" has the id 2147483647, outside the ids a tokenizer may use \(\[0, 16777216\)\)" \
  tokenize --tokenizer "$H/id31" --out "$TMP/u.bin" "${INPUTS[0]}"
expect_fail 2 "added_tokens\[1\]: the added token \"<huge>\" has the id 1099511627776, outside the ids" \
  tokenize --tokenizer "$H/id40" --out "$TMP/u.bin" "${INPUTS[0]}"
expect_fail 2 "model.vocab\[\"Hello\"\]: the id 1099511627776 is outside the ids" \
  tokenize --tokenizer "$H/vocab40" --out "$TMP/u.bin" "${INPUTS[0]}"
mkdir -p "$H/dir/tokenizer.json"
expect_fail 2 "tokenizer.json $H/dir/tokenizer.json: is a directory, not a regular file" \
  tokenize --tokenizer "$H/dir" --out "$TMP/u.bin" "${INPUTS[0]}"
python3 -c 'print("[" * 100000 + "]" * 100000)' > "$TMP/deep.jsonl"
expect_fail 2 "deep.jsonl:1: arrays and objects nested deeper than 128 levels" \
  tokenize --tokenizer "$G" --out "$TMP/u.bin" "$TMP/deep.jsonl"
[[ ! -e $TMP/u.bin ]] && echo "ok: no token file written" || { echo "FAIL: u.bin written"; FAILURES=$((FAILURES + 1)); }
# --- end of the hostile-input block
# --- tokenize --out: what may be replaced (issue 35; lib/engine/output_path.h). Only a regular
# file, and never a run's own file, whatever --overwrite says.
O=$TMP/outs; mkdir -p "$O/dir"; echo keep > "$O/keep.txt"; mkfifo "$O/fifo"
mknod "$O/null" c 1 3 2>/dev/null || echo "note: mknod needs root; the device case is skipped"
outs_before=$(tree_digest "$O"); run_before=$(tree_digest "$TMP/run")
if [[ -c $O/null ]]; then
  expect_fail 2 "--out $O/null: it is a character device, not a regular file" \
    tokenize --tokenizer "$G" --out "$O/null" --overwrite "${INPUTS[0]}"
fi
expect_fail 2 "--out $O/fifo: it is a FIFO, not a regular file" \
  tokenize --tokenizer "$G" --out "$O/fifo" --overwrite "${INPUTS[0]}"
expect_fail 2 "--out $O/dir: it is a directory, not a regular file" \
  tokenize --tokenizer "$G" --out "$O/dir" --overwrite "${INPUTS[0]}"
expect_fail 2 "--out $TMP/run/config.yaml: it is one of the files of the run $TMP/run \(config.yaml\)" \
  tokenize --tokenizer "$G" --out "$TMP/run/config.yaml" --overwrite "${INPUTS[0]}"
expect_fail 2 "--out $TMP/run/metrics.jsonl: it is one of the files of the run" \
  tokenize --tokenizer "$G" --out "$TMP/run/metrics.jsonl" --overwrite "${INPUTS[0]}"
expect_fail 2 "--out $TMP/run/checkpoints/t.bin: it is inside $TMP/run/checkpoints" \
  tokenize --tokenizer "$G" --out "$TMP/run/checkpoints/t.bin" "${INPUTS[0]}"
expect_unchanged "$O" "$outs_before"
expect_unchanged "$TMP/run" "$run_before"
# A new file in a run directory is an output like any other.
"$FDTRAIN" tokenize --tokenizer "$G" --out "$TMP/run/tokens.bin" "${INPUTS[0]}" > /dev/null 2>&1 \
  && [[ -f $TMP/run/tokens.bin ]] && echo "ok: --out RUN/tokens.bin (a new name in a run directory)" \
  || { echo "FAIL: --out RUN/tokens.bin"; FAILURES=$((FAILURES + 1)); }
# --- end of the --out block
finish
