#!/usr/bin/env bash
# data.format preference, up to the data: `data preview` shows each pair's prompt and its
# chosen and rejected completions marked ([[ ]]), for conversational and standard records;
# `fdtrain validate` reads a preference recipe; then the bad inputs: a preference file given
# to format chat and a chat file to format preference (each names the format to use), bad
# records (FILE:LINE, or skipped and counted with on_bad_record: skip), a data.max_length
# that cannot fit a row, and the data keys preference pairs have no use for.
source "$(dirname "$0")/common.bash"
TOK=recipes/tokenizers/chatml-bytes

python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
def conv(user, chosen, rejected, system=None):
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return {"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}]}
with open(f"{d}/conv.jsonl", "w") as f:
    f.write(json.dumps(conv("Hi", "Hello.", "Go away.", system="Be kind.")) + "\n")
    for i in range(7):
        f.write(json.dumps(conv(f"Count to {i}", " ".join(map(str, range(i + 1))), "no")) + "\n")
with open(f"{d}/std.jsonl", "w") as f:
    f.write(json.dumps({"prompt": "Sky: ", "chosen": "blue", "rejected": "green"}) + "\n")
    f.write(json.dumps({"prompt": "Grass: ", "chosen": "green<|im_end|>", "rejected": "green"}) + "\n")
with open(f"{d}/bad.jsonl", "w") as f:
    f.write(json.dumps(conv("Hi", "Hello.", "Go away.")) + "\n")
    f.write(json.dumps({"prompt": "Hi", "chosen": [{"role": "assistant", "content": "x"}], "rejected": "y"}) + "\n")
    f.write(json.dumps({"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "x"}]}) + "\n")
    for i in range(4):
        f.write(json.dumps(conv(f"Q{i}", "yes", "no")) + "\n")
with open(f"{d}/chat.jsonl", "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}) + "\n")
PY
cat > "$TMP/pref.yaml" <<YAML
model: {arch: llama, n_layer: 1, n_head: 2, n_kv_head: 1, d_model: 16, d_ff: 32, vocab_size: 260, max_seq_len: 128}
data:
  format: preference
  train: [$TMP/conv.jsonl]
  tokenizer: $TOK
  seq_len: 128
  val_fraction: 0.25
objective: {name: dpo}
batch: {micro: 2}
steps: 2
logging: {every: 1, eval_every: 0, sample_tokens: 0}
YAML

# --- preview: the prompt as rendered with the generation prompt, each completion marked.
preview=$("$FDTRAIN" data preview "$TMP/pref.yaml" --n 2 --color never)
if grep -qF '=== pair 1: ' <<<"$preview" && grep -qF '<|im_start|>system' <<<"$preview" &&
   grep -qF '[[Hello.<|im_end|>' <<<"$preview" && grep -qF '[[Go away.<|im_end|>' <<<"$preview" &&
   grep -qF '=== pair 2: ' <<<"$preview" && ! grep -qF '=== pair 3' <<<"$preview"; then
  echo "ok: data preview shows conversational pairs, completions marked"
else echo "FAIL: preference preview"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
preview=$("$FDTRAIN" data preview "$TMP/pref.yaml" "data.train=[$TMP/std.jsonl]" --color never)
if grep -qF '[[blue<|im_end|>]]' <<<"$preview" && grep -qF '[[green<|im_end|>]]' <<<"$preview" &&
   ! grep -qF '<|im_end|><|im_end|>' <<<"$preview"; then
  echo "ok: data preview: standard pairs get the EOS text once"
else echo "FAIL: standard preview"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
preview=$("$FDTRAIN" data preview "$TMP/pref.yaml" data.max_length=8 --n 1 --color never)
if grep -qF 'dropped: the prompt alone has data.max_length = 8' <<<"$preview"; then
  echo "ok: data preview says which pairs max_length drops"
else echo "FAIL: preview drop"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi

# --- validate reads the pairs as training would.
out=$("$FDTRAIN" validate "$TMP/pref.yaml" 2>&1) && echo "ok: validate accepts a preference recipe" ||
  { echo "FAIL: validate preference"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }
out=$("$FDTRAIN" print-config "$TMP/pref.yaml" 2>&1)
grep -q "max_length" <<<"$out" && echo "ok: print-config names data.max_length" ||
  { echo "FAIL: print-config max_length"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); }

# --- the wrong format, either way round: the message names the format to use.
expect_fail 2 "conv.jsonl:1: the record looks like preference data .*data.format: preference" \
  validate "$TMP/pref.yaml" data.format=chat objective=null
expect_fail 2 "conv.jsonl:1: the record looks like preference data .*data.format: preference" \
  validate "$TMP/pref.yaml" data.format=chat objective=null data.on_bad_record=skip
expect_fail 2 "chat.jsonl:1: the record looks like chat data .*data.format: chat" \
  validate "$TMP/pref.yaml" "data.train=[$TMP/chat.jsonl]"

# --- bad records: FILE:LINE and the reason, or skipped and counted.
expect_fail 2 "bad.jsonl:2: \"prompt\" is a string but \"chosen\" is an array" \
  validate "$TMP/pref.yaml" "data.train=[$TMP/bad.jsonl]"
sed 2d "$TMP/bad.jsonl" > "$TMP/missing.jsonl"
expect_fail 2 "missing.jsonl:2: missing \"rejected\"" \
  validate "$TMP/pref.yaml" "data.train=[$TMP/missing.jsonl]" data.on_bad_record=error
out=$("$FDTRAIN" data preview "$TMP/pref.yaml" "data.train=[$TMP/bad.jsonl]" data.on_bad_record=skip --n 10 --color never 2>&1)
if grep -qF '(2 bad records skipped, data.on_bad_record: skip)' <<<"$out" && [[ $(grep -c '=== pair' <<<"$out") == 5 ]]; then
  echo "ok: on_bad_record skip: the 2 bad records left out and counted"
else echo "FAIL: skip"; echo "$out" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
"$FDTRAIN" validate "$TMP/pref.yaml" "data.train=[$TMP/bad.jsonl]" data.on_bad_record=skip > /dev/null 2>&1 &&
  echo "ok: validate with on_bad_record skip" || { echo "FAIL: validate skip"; FAILURES=$((FAILURES + 1)); }

# --- lengths and keys.
expect_fail 2 "data.max_length: 80 is too long for data.seq_len 128: a pair's chosen and rejected sequences share one row" \
  validate "$TMP/pref.yaml" data.max_length=80
expect_fail 2 "data.max_length: .*applies to data.format preference" \
  validate "$TMP/pref.yaml" data.format=chat "data.train=[$TMP/chat.jsonl]" data.max_length=8
expect_fail 2 "data.truncation: does not apply to data.format preference: .*data.max_length" \
  validate "$TMP/pref.yaml" data.truncation=right
expect_fail 2 "data.train_on_prompt: does not apply to data.format preference" \
  validate "$TMP/pref.yaml" data.train_on_prompt=true
expect_fail 2 "data.tokenizer: data.format preference needs the model's tokenizer" \
  validate "$TMP/pref.yaml" data.tokenizer=
expect_fail 2 "no training pair left" \
  validate "$TMP/pref.yaml" data.max_length=4 data.val_fraction=0
finish
