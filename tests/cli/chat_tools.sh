#!/usr/bin/env bash
# Function-calling chat data from the command line: `fdtrain template` renders a record with
# tool calls, tool results and a tools list exactly as @huggingface/jinja does (Qwen 2.5's
# template; tests/data/chat_tools_test.cc covers four families) and --json's target is the
# whole assistant turn from <tool_call> to <|im_end|>; --template-vars reaches the template
# (Qwen 3's enable_thinking) and names a variable it never reads; `data preview` marks the
# calls; data.template_vars in a recipe is checked; a template without tool calls, malformed
# calls and a tool result with no call are refused with FILE:LINE, or skipped and counted;
# Qwen 3 writes the last answer's reasoning_content in its target, and what a template drops
# is warned about once and counted in summary.json; an integer beyond 2^53 is refused.
source "$(dirname "$0")/common.bash"
NPM=tests/fixtures/npm/node_modules/@lenml
[[ -f $NPM/tokenizer-qwen2_5/models/tokenizer.json ]] ||
  { echo "FAIL: $NPM is missing: run scripts/install_deps.sh"; exit 1; }
QWEN25=$NPM/tokenizer-qwen2_5/models
QWEN3=$NPM/tokenizer-qwen3/models

head -1 tests/data/chat_tools_records.jsonl > "$TMP/call.json"
head -1 tests/data/chat_tools_records.jsonl > "$TMP/call.jsonl"

# --- template: byte for byte as @huggingface/jinja, the call turn a target from <tool_call>.
"$FDTRAIN" template --tokenizer "$QWEN25" --messages "$TMP/call.json" > "$TMP/ours.txt" ||
  { echo "FAIL: template with tool calls"; FAILURES=$((FAILURES + 1)); }
node tests/data/chat_hf_reference.mjs --models "$NPM" --templates qwen2_5 \
  --records "$TMP/call.jsonl" --out "$TMP/ref.jsonl"
python3 - "$TMP/ref.jsonl" "$TMP/ours.txt" <<'PY' && echo "ok: template: a tool-call record identical to @huggingface/jinja" || { echo "FAIL: template differs"; FAILURES=$((FAILURES + 1)); }
import json, sys
ref = json.loads(open(sys.argv[1]).readline())
ours = open(sys.argv[2], encoding="utf-8").read()
assert ref["ok"] and ref["text"] == ours, (ref, ours)
PY
out=$("$FDTRAIN" template --tokenizer "$QWEN25" --messages "$TMP/call.json" --json)
python3 - "$out" <<'PY' && echo "ok: template --json: the tool call turn and the answer are the targets, not the result" || { echo "FAIL: template --json targets"; FAILURES=$((FAILURES + 1)); }
import json, sys
j = json.loads(sys.argv[1])
t = j["text"].encode()
spans = [t[b:e].decode() for b, e in j["targets"]]
assert len(spans) == 2, spans
assert spans[0].startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"'), spans[0]
assert spans[0].endswith("</tool_call><|im_end|>"), spans[0]
assert spans[1] == "It is 18 °C and cloudy in Paris right now.<|im_end|>", spans[1]
assert all("temperature" not in s for s in spans), spans
PY

# --- --template-vars: Qwen 3's enable_thinking moves the empty think block into the prompt.
printf '[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]' > "$TMP/hi.json"
on=$("$FDTRAIN" template --tokenizer "$QWEN3" --messages "$TMP/hi.json" --json)
off=$("$FDTRAIN" template --tokenizer "$QWEN3" --messages "$TMP/hi.json" --json \
      --template-vars '{"enable_thinking": false}')
python3 - "$on" "$off" <<'PY' && echo "ok: --template-vars: enable_thinking decides whether the think block is the model's" || { echo "FAIL: --template-vars"; FAILURES=$((FAILURES + 1)); }
import json, sys
def target(s):
    j = json.loads(s); t = j["text"].encode()
    return [t[b:e].decode() for b, e in j["targets"]]
assert target(sys.argv[1]) == ["<think>\n\n</think>\n\nHello.<|im_end|>"], target(sys.argv[1])
assert target(sys.argv[2]) == ["Hello.<|im_end|>"], target(sys.argv[2])
PY
warn=$("$FDTRAIN" template --tokenizer "$QWEN3" --messages "$TMP/hi.json" \
       --template-vars '{"enable_thinkin": false}' 2>&1 >/dev/null)
if grep -qF 'warning: --template-vars.enable_thinkin: ' <<<"$warn" && grep -qF 'never reads "enable_thinkin"' <<<"$warn"; then
  echo "ok: --template-vars: a variable the template never reads is a warning naming it"
else echo "FAIL: unread variable warning: $warn"; FAILURES=$((FAILURES + 1)); fi
expect_fail 2 '--template-vars.enable_thinking: is a string; .* want a boolean' \
  template --tokenizer "$QWEN3" --messages "$TMP/hi.json" --template-vars '{"enable_thinking": "no"}'
expect_fail 2 '--template-vars: .*not valid JSON' \
  template --tokenizer "$QWEN3" --messages "$TMP/hi.json" --template-vars '{enable_thinking'

# --- data preview and validate of a recipe over function-calling records.
cp tests/data/chat_tools_records.jsonl "$TMP/tools.jsonl"
cat > "$TMP/tools.yaml" <<YAML
model: {arch: llama, n_layer: 1, n_head: 2, n_kv_head: 1, d_model: 32, d_ff: 64, vocab_size: 151936, max_seq_len: 1024}
data:
  format: chat
  train: [$TMP/tools.jsonl]
  tokenizer: $QWEN25
  packing: true
  seq_len: 1024
  val_fraction: 0
  template_vars: {enable_thinking: false}
steps: 1
YAML
preview=$("$FDTRAIN" data preview "$TMP/tools.yaml" --n 1 --color never 2>"$TMP/preview.err")
if grep -qF '[[<tool_call>' <<<"$preview" && grep -qF '</tool_call><|im_end|>]]' <<<"$preview" &&
   grep -qF 'data.template_vars.enable_thinking: ' "$TMP/preview.err"; then
  echo "ok: data preview marks the tool call; Qwen 2.5 never reads enable_thinking (a warning)"
else echo "FAIL: data preview of tool calls"; echo "$preview" | sed 's/^/    /'; cat "$TMP/preview.err"; FAILURES=$((FAILURES + 1)); fi
expect_fail 2 'tools.yaml:[0-9]+:[0-9]+: data.template_vars.enable_thinking: is a number; .* want a boolean' \
  validate "$TMP/tools.yaml" data.template_vars.enable_thinking=1
expect_fail 2 'data.template_vars.tools: "tools" is set by fdtrain itself' \
  validate "$TMP/tools.yaml" 'data.template_vars={tools: []}'
expect_fail 2 'tools.jsonl:1: messages\[1\] \(assistant\): .* does not write this message.s tool calls' \
  validate "$TMP/tools.yaml" data.chat_template=chatml

# --- reasoning_content and other keys of a message: written where Qwen 3 writes them, the
# rest named once (the run's summary.json counts them as data.not_written).
cp tests/data/chat_reasoning_records.jsonl "$TMP/reason.jsonl"
sed -e "s|train: \[$TMP/tools.jsonl\]|train: [$TMP/reason.jsonl]|" -e "s|tokenizer: $QWEN25|tokenizer: $QWEN3|" \
  -e '/template_vars/d' "$TMP/tools.yaml" > "$TMP/reason.yaml"
preview=$("$FDTRAIN" data preview "$TMP/reason.yaml" --n 1 --color never 2>"$TMP/reason.err")
if grep -qF 'the template does not write: assistant reasoning_content; the first at messages[1]' <<<"$preview" &&
   grep -qF '[[<think>' <<<"$preview" && grep -qF '51 + 17 = 68.' <<<"$preview" &&
   ! grep -qF '17 * 3 = 51, checking' <<<"$preview"; then
  echo "ok: data preview: Qwen 3 writes the last answer's reasoning_content in its target, the earlier one is named as not written"
else echo "FAIL: data preview of reasoning_content"; echo "$preview" | sed 's/^/    /'; FAILURES=$((FAILURES + 1)); fi
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -n 2 "$FDTRAIN" train "$TMP/reason.yaml" \
  data.packing=false --run-dir "$TMP/reason_run" > "$TMP/reason.out" 2>&1
warned=$(grep -c 'does not write these message texts: 1 assistant reasoning_content, 1 user lang' "$TMP/reason.out")
if [ "$warned" = 1 ] && grep -q 'reason.jsonl:1 messages\[1\]' "$TMP/reason.out" &&
   python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["data"]["not_written"]; sys.exit(d != {"assistant reasoning_content": 1, "user lang": 1})' \
     "$TMP/reason_run/summary.json"; then
  echo "ok: a 2-rank run warns once about the texts the template drops (the first's FILE:LINE); summary.json counts them"
else echo "FAIL: the not-written warning ($warned times)"; cat "$TMP/reason.out"; FAILURES=$((FAILURES + 1)); fi
python3 - "$TMP/big.jsonl" <<'PY'
import json, sys
rec = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
    {"id": "c1", "function": {"name": "f", "arguments": {"user_id": 9007199254740993}}}]}]}
open(sys.argv[1], "w").write(json.dumps(rec) + "\n")
PY
expect_fail 2 'big.jsonl:1: messages\[1\]: tool_calls\[0\].function.arguments.user_id: 9007199254740993: the number is beyond 2\^53.*give it as a string' \
  validate "$TMP/reason.yaml" "data.train=[$TMP/big.jsonl]"

# --- malformed records: FILE:LINE and the reason, or skipped and counted.
python3 - "$TMP/bad.jsonl" <<'PY'
import json, sys
good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
call = lambda args: {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": args}}]}
bad = [
    {"messages": [{"role": "user", "content": "q"}, call('{"x": ')]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}, {"role": "assistant", "content": "a"}]},
]
with open(sys.argv[1], "w") as f:
    for rec in [good] + bad + [good]:
        f.write(json.dumps(rec) + "\n")
PY
sed -i "s|train: \[$TMP/tools.jsonl\]|train: [$TMP/bad.jsonl]|" "$TMP/tools.yaml"
expect_fail 2 'bad.jsonl:2: messages\[1\]: tool_calls\[0\].function.arguments: the string is not valid JSON' \
  validate "$TMP/tools.yaml"
head -1 "$TMP/bad.jsonl" > "$TMP/one.jsonl"; sed -n 3p "$TMP/bad.jsonl" >> "$TMP/one.jsonl"
expect_fail 2 'one.jsonl:2: messages\[1\]: a tool result with no tool call before it' \
  validate "$TMP/tools.yaml" "data.train=[$TMP/one.jsonl]"
head -1 "$TMP/bad.jsonl" > "$TMP/img.jsonl"; sed -n 4p "$TMP/bad.jsonl" >> "$TMP/img.jsonl"
expect_fail 2 'img.jsonl:2: messages\[0\]: content\[0\]: part type "image_url" is not supported' \
  validate "$TMP/tools.yaml" "data.train=[$TMP/img.jsonl]"
out=$("$FDTRAIN" validate "$TMP/tools.yaml" data.on_bad_record=skip 2>&1) && grep -q ': ok' <<<"$out" &&
  echo "ok: validate with on_bad_record: skip passes over the 3 bad records" ||
  { echo "FAIL: skip bad tool records"; echo "$out"; FAILURES=$((FAILURES + 1)); }

finish
