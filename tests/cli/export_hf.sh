#!/usr/bin/env bash
# `ckpt export --hf-dir`: a tiny Llama trained for a few steps becomes a
# Hugging Face model directory: config.json as transformers writes it (read
# back with json), safetensors headers with HF's names, shapes and dtype (read
# with struct + json), identical bytes when exported again, half the size in
# bf16, shards + index under a small --max-shard-size, bos/eos ids (null from
# scratch, carried as they are from a source directory), an existing directory
# refused without --overwrite, and a LoRA run exported merged (--merge-lora,
# checked against its base) or refused without it; its PEFT adapter has the
# Llama family's PEFT names (fan_in_fan_out false). Outputs: a user's DIR.tmp is
# never touched; a FIFO, a directory as --out, a run's own files, its
# checkpoints and a run as --lora-adapter are refused (tree digests before and
# after); a data.tokenizer run exports its tokenizer and generate --chat works.
source "$(dirname "$0")/common.bash"
HERE=$(dirname "$0")
R=$TMP/llama.yaml
cat > "$R" <<'YAML'
model: {arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 64, d_ff: 128, vocab_size: 256, max_seq_len: 64}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.0
  seq_len: 32
batch:
  micro: 2
optimizer:
  lr: 1.0e-3
steps: 4
checkpoint:
  every: 4
logging:
  every: 1
  sample_tokens: 0
YAML
"$FDTRAIN" train "$R" --run-dir "$TMP/run" --no-progress > "$TMP/train.log" 2>&1 \
  || { echo "FAIL: training"; tail -5 "$TMP/train.log"; exit 1; }

# check_dir DIR DTYPE TIED: config.json and the weights, read independently.
check_dir() {
  python3 - "$@" <<'PY'
import json, os, struct, sys
d, dtype, tied = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
text = open(os.path.join(d, "config.json")).read()
cfg = json.loads(text)
assert text == json.dumps(cfg, indent=2, sort_keys=True) + "\n", "not as transformers writes it"
want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
        "max_position_embeddings": 64, "hidden_act": "silu", "rope_scaling": None,
        "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16"}[dtype]}
for k, v in want.items():
    assert cfg.get(k) == v, f"config.json {k} = {cfg.get(k)!r}, expected {v!r}"
shapes = {"model.embed_tokens.weight": [256, 64], "model.norm.weight": [64]}
if not tied:
    shapes["lm_head.weight"] = [256, 64]
for l in range(2):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [64], p + "post_attention_layernorm.weight": [64],
                   p + "self_attn.q_proj.weight": [64, 64], p + "self_attn.k_proj.weight": [32, 64],
                   p + "self_attn.v_proj.weight": [32, 64], p + "self_attn.o_proj.weight": [64, 64],
                   p + "mlp.gate_proj.weight": [128, 64], p + "mlp.up_proj.weight": [128, 64],
                   p + "mlp.down_proj.weight": [64, 128]})
index = os.path.join(d, "model.safetensors.index.json")
files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
    else ["model.safetensors"]
seen, data_bytes = {}, 0
for f in files:
    with open(os.path.join(d, f), "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        size = os.fstat(fh.fileno()).st_size - 8 - n
    header.pop("__metadata__", None)
    for name, e in header.items():
        assert e["dtype"] == dtype, f"{f}: {name} is {e['dtype']}, expected {dtype}"
        b, end = e["data_offsets"]
        assert 0 <= b <= end <= size, f"{f}: {name} offsets out of range"
        seen[name] = e["shape"]
        data_bytes += end - b
if os.path.exists(index):
    idx = json.load(open(index))
    assert sorted(idx["weight_map"]) == sorted(seen), "index and shards disagree"
    assert idx["metadata"]["total_size"] == data_bytes, "total_size is not the tensors' bytes"
assert seen == shapes, f"tensors {sorted(set(seen) ^ set(shapes))} differ; shapes {seen}"
print(f"{len(files)} file(s), {len(seen)} tensors")
PY
}

"$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/hf" > "$TMP/export.log" 2>&1 \
  || { echo "FAIL: export --hf-dir"; cat "$TMP/export.log"; exit 1; }
out=$(check_dir "$TMP/hf" F32 false 2>&1) && [ ! -e "$TMP/hf/model.safetensors.index.json" ] \
  && echo "ok: config.json and model.safetensors have Hugging Face's keys, names, shapes, F32 ($out)" \
  || { echo "FAIL: hf dir: $out"; FAILURES=$((FAILURES + 1)); }

# bos/eos: a run from scratch does not know them and says so (null: a missing key would read as
# LlamaConfig's 1 and 2); a run from a Hugging Face directory carries that directory's keys as
# they are (a list stays a list, a missing key stays missing).
token_ids() {
  python3 -c 'import json, sys; c = json.load(open(sys.argv[1] + "/config.json"))
print(json.dumps([c.get(k, "absent") for k in ("bos_token_id", "eos_token_id")]))' "$1"
}
[ "$(token_ids "$TMP/hf")" = "[null, null]" ] \
  && echo "ok: a run from scratch exports bos_token_id and eos_token_id as null" \
  || { echo "FAIL: from scratch: $(token_ids "$TMP/hf")"; FAILURES=$((FAILURES + 1)); }
for ids in '{"bos_token_id": 1, "eos_token_id": [2, 3]}' '{}'; do
  rm -rf "$TMP/src" "$TMP/from_src" "$TMP/hf_src"
  cp -r "$TMP/hf" "$TMP/src"
  python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p))
for k in ("bos_token_id", "eos_token_id"): c.pop(k)
c.update(json.loads(sys.argv[2])); json.dump(c, open(p, "w"), indent=2, sort_keys=True)' "$TMP/src" "$ids"
  want=$(token_ids "$TMP/src")
  "$FDTRAIN" train "$R" model.init_from="$TMP/src" steps=1 checkpoint.every=1 --run-dir "$TMP/from_src" \
    --no-progress > "$TMP/from_src.log" 2>&1 \
    && "$FDTRAIN" ckpt export "$TMP/from_src" --hf-dir "$TMP/hf_src" > /dev/null 2>&1 \
    && [ "$(token_ids "$TMP/hf_src")" = "$want" ] \
    && echo "ok: a run from a directory with $ids exports its token ids as they are ($want)" \
    || { echo "FAIL: token ids from $ids: $(token_ids "$TMP/hf_src" 2>&1), expected $want"
         tail -3 "$TMP/from_src.log"; FAILURES=$((FAILURES + 1)); }
done

"$FDTRAIN" ckpt export "$TMP/run/checkpoints/step_00000004" --hf-dir "$TMP/hf_again" > /dev/null 2>&1
# The metadata names the step directory, the same for both.
diff -r "$TMP/hf" "$TMP/hf_again" > /dev/null \
  && echo "ok: exporting again gives identical bytes" \
  || { echo "FAIL: the second export differs"; FAILURES=$((FAILURES + 1)); }

"$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/hf_bf16" --dtype bf16 > /dev/null 2>&1 \
  || { echo "FAIL: bf16 export"; FAILURES=$((FAILURES + 1)); }
out=$(check_dir "$TMP/hf_bf16" BF16 false 2>&1) || { echo "FAIL: bf16 dir: $out"; FAILURES=$((FAILURES + 1)); }
f32=$(stat -c %s "$TMP/hf/model.safetensors"); bf16=$(stat -c %s "$TMP/hf_bf16/model.safetensors")
awk -v a="$f32" -v b="$bf16" 'BEGIN { exit !(b * 2 > a * 0.98 && b * 2 < a * 1.02) }' \
  && echo "ok: bf16 halves the weights ($f32 -> $bf16 bytes)" \
  || { echo "FAIL: bf16 $bf16 bytes vs fp32 $f32"; FAILURES=$((FAILURES + 1)); }

"$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/hf_sharded" --max-shard-size 100KB > /dev/null 2>&1 \
  || { echo "FAIL: sharded export"; FAILURES=$((FAILURES + 1)); }
out=$(check_dir "$TMP/hf_sharded" F32 false 2>&1) && [ -e "$TMP/hf_sharded/model.safetensors.index.json" ] \
  && [ ! -e "$TMP/hf_sharded/model.safetensors" ] \
  && echo "ok: --max-shard-size 100KB writes shards and an index ($out)" \
  || { echo "FAIL: sharded: $out"; ls "$TMP/hf_sharded"; FAILURES=$((FAILURES + 1)); }

# Without --dtype, the run's precision decides.
"$FDTRAIN" train "$R" precision=bf16 steps=2 checkpoint.every=2 --run-dir "$TMP/run_bf16" --no-progress \
  > /dev/null 2>&1 && "$FDTRAIN" ckpt export "$TMP/run_bf16" --hf-dir "$TMP/hf_run_bf16" > /dev/null 2>&1 \
  && out=$(check_dir "$TMP/hf_run_bf16" BF16 false 2>&1) \
  && echo "ok: a bf16 run exports bf16 by default" \
  || { echo "FAIL: bf16 run's default dtype: $out"; FAILURES=$((FAILURES + 1)); }

expect_fail 2 "already exists and is not empty; pass --overwrite" ckpt export "$TMP/run" --hf-dir "$TMP/hf"
expect_fail 2 "max-shard-size 5TB: expected bytes" ckpt export "$TMP/run" --hf-dir "$TMP/x" --max-shard-size 5TB
expect_fail 2 "not from a LoRA run.*drop --merge-lora" ckpt export "$TMP/run" --hf-dir "$TMP/x" --merge-lora
expect_fail 2 "applies to --hf-dir only" ckpt export "$TMP/run" --out "$TMP/x.safetensors" --max-shard-size 1MB
# --overwrite never replaces what a user would lose: a run, the checkpoint read, a non-export.
expect_fail 2 "holds a run or a checkpoint \(.*\), which --overwrite would delete" \
  ckpt export "$TMP/run" --hf-dir "$TMP/run" --overwrite
expect_fail 2 "holds a run or a checkpoint" \
  ckpt export "$TMP/run" --hf-dir "$TMP/run/checkpoints" --overwrite
mkdir -p "$TMP/notes" && echo keep > "$TMP/notes/todo.txt"
expect_fail 2 "replaces only a Hugging Face model directory" \
  ckpt export "$TMP/run" --hf-dir "$TMP/notes" --overwrite
[ -f "$TMP/notes/todo.txt" ] && [ -f "$TMP/run/summary.json" ] && echo "ok: nothing was deleted" \
  || { echo "FAIL: a refused --overwrite deleted something"; FAILURES=$((FAILURES + 1)); }
"$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/hf" --overwrite --dtype bf16 > /dev/null 2>&1 \
  && check_dir "$TMP/hf" BF16 false > /dev/null 2>&1 \
  && echo "ok: --overwrite replaces the directory" \
  || { echo "FAIL: --overwrite"; FAILURES=$((FAILURES + 1)); }
[ ! -e "$TMP/x" ] && [ ! -e "$TMP/hf.tmp" ] && echo "ok: refused exports leave nothing behind" \
  || { echo "FAIL: leftovers"; ls "$TMP"; FAILURES=$((FAILURES + 1)); }

# LoRA: a tied base (a weights file, as model.init_from reads it), adapters on q and v.
"$FDTRAIN" train "$R" model.tie_embeddings=true --run-dir "$TMP/base" --no-progress > /dev/null 2>&1 \
  && "$FDTRAIN" ckpt export "$TMP/base" --out "$TMP/base.safetensors" > /dev/null 2>&1 \
  || { echo "FAIL: base run and export"; exit 1; }
"$FDTRAIN" train "$R" model.tie_embeddings=true model.init_from="$TMP/base.safetensors" \
  "lora={r: 4, alpha: 8, targets: [q_proj, v_proj]}" optimizer.lr=1e-2 --run-dir "$TMP/lora" \
  --no-progress > "$TMP/lora.log" 2>&1 || { echo "FAIL: LoRA run"; tail -5 "$TMP/lora.log"; exit 1; }
expect_fail 2 "holds only the adapters.*--merge-lora.*--lora-adapter DIR" \
  ckpt export "$TMP/lora" --hf-dir "$TMP/merged"
expect_fail 2 "this is a llama run; write the merged model as a Hugging Face directory" \
  ckpt export "$TMP/lora" --merge-lora --out "$TMP/merged.safetensors"
"$FDTRAIN" ckpt export "$TMP/lora" --hf-dir "$TMP/merged" --merge-lora > "$TMP/merged.log" 2>&1 \
  || { echo "FAIL: --merge-lora"; cat "$TMP/merged.log"; FAILURES=$((FAILURES + 1)); }
out=$(check_dir "$TMP/merged" F32 true 2>&1 && python3 "$HERE/../ckpt/read_safetensors.py" "$TMP/base.safetensors" \
  | python3 -c '
import sys, subprocess
base = {l.split("\t")[0]: l.split("\t")[4] for l in sys.stdin.read().splitlines() if l.count("\t") == 4}
merged = {l.split("\t")[0]: l.split("\t")[4]
          for l in subprocess.run(["python3", sys.argv[1], sys.argv[2]], capture_output=True,
                                  text=True, check=True).stdout.splitlines() if l.count("\t") == 4}
assert set(base) == set(merged), "names differ from the base"
changed = sorted(n for n in base if base[n] != merged[n])
want = sorted(f"model.layers.{l}.self_attn.{m}_proj.weight" for l in range(2) for m in "qv")
assert changed == want, f"changed {changed}, expected {want}"
print(f"{len(changed)} of {len(base)} tensors differ from the base: q_proj and v_proj")
' "$HERE/../ckpt/read_safetensors.py" "$TMP/merged/model.safetensors" 2>&1) \
  && echo "ok: --merge-lora writes the merged model ($out)" \
  || { echo "FAIL: merged: $out"; FAILURES=$((FAILURES + 1)); }

"$FDTRAIN" ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter" > /dev/null 2>&1 \
  || { echo "FAIL: adapter export"; FAILURES=$((FAILURES + 1)); }
out=$(python3 - "$TMP/adapter" <<'PY' 2>&1
import json, os, struct, sys
d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
assert cfg["fan_in_fan_out"] is False, cfg["fan_in_fan_out"]
assert cfg["target_modules"] == ["q_proj", "v_proj"], cfg["target_modules"]
with open(os.path.join(d, "adapter_model.safetensors"), "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
header.pop("__metadata__", None)
want = {}
for l in range(2):
    for m, out in (("q", 64), ("v", 32)):
        p = f"base_model.model.model.layers.{l}.self_attn.{m}_proj."
        want[p + "lora_A.weight"], want[p + "lora_B.weight"] = [4, 64], [out, 4]
got = {k: v["shape"] for k, v in header.items()}
assert got == want, f"keys {sorted(set(got) ^ set(want))}; {got}"
print(f"{len(got)} tensors")
PY
) && echo "ok: the PEFT adapter has the Llama family's keys, shapes and fan_in_fan_out false ($out)" \
  || { echo "FAIL: adapter: $out"; FAILURES=$((FAILURES + 1)); }
# The Llama adapter reads back (lora.adapter): training starts from it exactly.
"$FDTRAIN" train "$R" model.tie_embeddings=true model.init_from="$TMP/base.safetensors" \
  "lora={r: 4, alpha: 8, targets: [q_proj, v_proj], adapter: $TMP/adapter}" steps=1 optimizer.lr=1e-30 \
  optimizer.weight_decay=0 checkpoint.every=1 --run-dir "$TMP/from_adapter" --no-progress > "$TMP/fa.log" 2>&1 \
  || { echo "FAIL: train from the adapter"; tail -3 "$TMP/fa.log"; FAILURES=$((FAILURES + 1)); }
rel=$("$FDTRAIN" ckpt diff "$TMP/from_adapter" "$TMP/lora" 2>&1 | sed -n 's/^relative_difference //p')
awk -v r="$rel" 'BEGIN { exit !(r != "" && r == 0) }' \
  && echo "ok: training starts from the exported Llama adapter exactly" \
  || { echo "FAIL: from the adapter: relative difference '$rel'"; FAILURES=$((FAILURES + 1)); }
# --- Outputs never replace what is not the export's own (issue 35; lib/engine/output_path.h).
# A directory of the user's named like a staging directory is left alone: an export stages in a
# fresh DIR.tmp-XXXXXX and removes nothing it did not make.
mkdir -p "$TMP/fresh.tmp" "$TMP/adapter2.tmp"
echo mine > "$TMP/fresh.tmp/notes.txt"; echo mine > "$TMP/adapter2.tmp/notes.txt"
keep=$(tree_digest "$TMP/fresh.tmp"); keep2=$(tree_digest "$TMP/adapter2.tmp")
"$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/fresh" > /dev/null 2>&1 && [[ -f $TMP/fresh/config.json ]] \
  && echo "ok: --hf-dir DIR beside a user's DIR.tmp" || { echo "FAIL: --hf-dir fresh"; FAILURES=$((FAILURES + 1)); }
expect_unchanged "$TMP/fresh.tmp" "$keep"
"$FDTRAIN" ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter2" > /dev/null 2>&1 \
  && [[ -f $TMP/adapter2/adapter_config.json ]] && echo "ok: --lora-adapter DIR beside a user's DIR.tmp" \
  || { echo "FAIL: --lora-adapter adapter2"; FAILURES=$((FAILURES + 1)); }
expect_unchanged "$TMP/adapter2.tmp" "$keep2"
left=$(ls -d "$TMP"/*.tmp-* 2>/dev/null)
[[ -z $left ]] && echo "ok: no staging directory left behind" || { echo "FAIL: left $left"; FAILURES=$((FAILURES + 1)); }

# What is not a file, a run's own files and its checkpoints are refused, --overwrite or not.
mkfifo "$TMP/pipe.safetensors"; mkdir -p "$TMP/dir.safetensors"
run_before=$(tree_digest "$TMP/run"); lora_before=$(tree_digest "$TMP/lora")
notes_before=$(tree_digest "$TMP/notes"); outs_before=$(ls -ld "$TMP/pipe.safetensors" "$TMP/dir.safetensors")
expect_fail 2 "--out $TMP/pipe.safetensors: it is a FIFO, not a regular file" \
  ckpt export "$TMP/run" --out "$TMP/pipe.safetensors" --overwrite
expect_fail 2 "--out $TMP/dir.safetensors: it is a directory, not a regular file" \
  ckpt export "$TMP/run" --out "$TMP/dir.safetensors" --overwrite
expect_fail 2 "--out $TMP/run/config.yaml: it is one of the files of the run $TMP/run \(config.yaml\)" \
  ckpt export "$TMP/run" --out "$TMP/run/config.yaml" --overwrite
expect_fail 2 "--out $TMP/run/checkpoints/w.safetensors: it is inside $TMP/run/checkpoints, which the run" \
  ckpt export "$TMP/run" --out "$TMP/run/checkpoints/w.safetensors"
expect_fail 2 "--hf-dir $TMP/run/checkpoints/hf: it is inside $TMP/run/checkpoints" \
  ckpt export "$TMP/run" --hf-dir "$TMP/run/checkpoints/hf"
expect_fail 2 "--lora-adapter $TMP/lora: it is a run directory" \
  ckpt export "$TMP/lora" --lora-adapter "$TMP/lora" --overwrite
expect_fail 2 "--lora-adapter $TMP/notes: --overwrite replaces only a PEFT adapter directory" \
  ckpt export "$TMP/lora" --lora-adapter "$TMP/notes" --overwrite
expect_unchanged "$TMP/run" "$run_before"
expect_unchanged "$TMP/lora" "$lora_before"
expect_unchanged "$TMP/notes" "$notes_before"
[[ $(ls -ld "$TMP/pipe.safetensors" "$TMP/dir.safetensors") == "$outs_before" && -p $TMP/pipe.safetensors ]] \
  && echo "ok: the FIFO and the directory are as they were" \
  || { echo "FAIL: the FIFO or the directory changed"; FAILURES=$((FAILURES + 1)); }
# New names in a run directory are outputs like any other (the Makefile's demos write there).
"$FDTRAIN" ckpt export "$TMP/run" --out "$TMP/run/model.safetensors" > /dev/null 2>&1 \
  && "$FDTRAIN" ckpt export "$TMP/run" --out "$TMP/run/model.safetensors" --overwrite > /dev/null 2>&1 \
  && "$FDTRAIN" ckpt export "$TMP/run" --hf-dir "$TMP/run/hf" > /dev/null 2>&1 \
  && [[ -f $TMP/run/model.safetensors && -f $TMP/run/hf/config.json ]] \
  && echo "ok: RUN/model.safetensors and RUN/hf are written (and replaced with --overwrite)" \
  || { echo "FAIL: new outputs inside a run directory"; FAILURES=$((FAILURES + 1)); }

# A run trained with data.tokenizer: the export carries the tokenizer files and the tokenizer's
# bos/eos ids (README: "config.json + safetensors (+ tokenizer files)"), so `generate --chat`
# on the export answers exactly as on the run.
TOK=recipes/tokenizers/chatml-bytes
python3 - "$TMP/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "Hello there."}]}) + "\n")
PY
"$FDTRAIN" train "$R" data.format=chat "data.train=[$TMP/chat.jsonl]" data.tokenizer=$TOK \
  data.packing=true data.seq_len=64 model.vocab_size=260 steps=30 optimizer.lr=1e-2 \
  checkpoint.every=30 --run-dir "$TMP/chat" --no-progress > "$TMP/chat.log" 2>&1 \
  || { echo "FAIL: chat run"; tail -5 "$TMP/chat.log"; FAILURES=$((FAILURES + 1)); }
"$FDTRAIN" ckpt export "$TMP/chat" --hf-dir "$TMP/chat_hf" > "$TMP/chat_export.log" 2>&1 \
  || { echo "FAIL: chat export"; cat "$TMP/chat_export.log"; FAILURES=$((FAILURES + 1)); }
out=$(python3 - "$TMP/chat_hf" "$TOK" <<'PY' 2>&1
import filecmp, json, os, sys
d, tok = sys.argv[1:]
for f in ("tokenizer.json", "tokenizer_config.json"):
    assert filecmp.cmp(os.path.join(d, f), os.path.join(tok, f), shallow=False), f
c = json.load(open(os.path.join(d, "config.json")))
assert c["bos_token_id"] is None and c["eos_token_id"] == 257, (c["bos_token_id"], c["eos_token_id"])
print("tokenizer.json, tokenizer_config.json; bos null, eos 257 (<|im_end|>)")
PY
) && echo "ok: the export of a data.tokenizer run has its tokenizer ($out)" \
  || { echo "FAIL: tokenizer files: $out"; FAILURES=$((FAILURES + 1)); }
a=$("$FDTRAIN" generate "$TMP/chat" --chat --prompt Hi --temperature 0 --max-tokens 20 --json 2>/dev/null)
b=$("$FDTRAIN" generate "$TMP/chat_hf" --chat --prompt Hi --temperature 0 --max-tokens 20 --json \
    2>"$TMP/gen.err")
if python3 -c 'import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
assert a["tokens"] == b["tokens"] and a["text"] == b["text"], (a, b)
print("    %d tokens: %r" % (len(b["tokens"]), b["text"]))' "$a" "$b"; then
  echo "ok: generate --chat on the export answers as on the run"
else
  echo "FAIL: generate --chat on the export"; sed 's/^/    /' "$TMP/gen.err"; FAILURES=$((FAILURES + 1))
fi
finish
