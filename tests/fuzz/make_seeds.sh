#!/usr/bin/env bash
# Regenerates the seed corpora in tests/fuzz/corpus/<target>/ from the shipped
# recipes and fixtures and from tiny runs of the fdtrain binary given as $1:
#   tests/fuzz/make_seeds.sh build-rel/bin/fdtrain
# Run from anywhere; the seeds are small (the whole corpus stays well under
# 2 MiB) and deterministic up to the HDF5 files' timestamps.
set -euo pipefail
FDTRAIN=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
C=$ROOT/tests/fuzz/corpus
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$ROOT"
# Only the corpora made here: corpus/jinja/ (templates) is kept as committed.
rm -rf "$C"/{recipe,token_file,tokenizer,safetensors,peft,shard,shard_hdf5}
rm -rf "$C"/{hf_config,hf_index,sft_records,tokenizer_config,chat_messages}
mkdir -p "$C"/{recipe,token_file,tokenizer,safetensors,peft,shard,shard_hdf5}

# recipe: the shipped recipes, fragments and config-test fixtures, and a few
# with overrides appended (NUL-separated, as recipe_fuzz.cc reads them).
for f in recipes/*.yaml configs/*/*.yaml tests/config/data/*.yaml tests/config/data/*/*.yaml; do
  [ -f "$f" ] && cp "$f" "$C/recipe/$(echo "$f" | tr / _)"
done
printf '%s\0steps=10\0optimizer.lr=1e-3\0~schedule' "$(cat recipes/quickstart.yaml)" > "$C/recipe/overrides_1"
printf '%s\0model=configs/models/gpt-nano.yaml\0zero.stage=3\0optimizer.betas=[0.9,0.99]\0lora={r: 4, targets: [c_attn]}' \
  "$(cat recipes/quickstart.yaml)" > "$C/recipe/overrides_2"
printf '%s\0precision=fp16\0loss_scale.initial_scale_power=8\0activation_checkpointing.layers=all\0checkpoint.every=5' \
  "$(cat recipes/quickstart.yaml)" > "$C/recipe/overrides_3"
printf 'steps: 1\ndata: {train: [recipes/quickstart.yaml], seq_len: 8}\n\0batch.global=16\0~data.val_fraction\0logging={every: 1}' \
  > "$C/recipe/overrides_4"
printf '%s\0model.quantize={type: fp4, block_size: 128, double_quant: false}\0lora={r: 2}' \
  "$(cat recipes/quickstart.yaml)" > "$C/recipe/overrides_5"

# tokenizer: small tokenizer.json files covering every component, each with a text.
python3 tests/fuzz/make_tokenizer_seeds.py "$C/tokenizer"

# hf_config, hf_index, sft_records, tokenizer_config, chat_messages: the real
# config.json, tokenizer_config.json, index and record files the tests use.
python3 tests/fuzz/make_json_seeds.py "$C"

# token_file: llm.c .bin files (valid, wrong magic, version, count), text.
python3 - "$C/token_file" <<'PY'
import struct, sys
d = sys.argv[1]
def llmc(name, tokens, magic=20240520, version=1, count=None, extra=b""):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack(f"<{len(tokens)}H", *tokens) + extra)
toks = [(i * 7919) % 50257 for i in range(200)]
llmc("llmc_valid.bin", toks)
llmc("llmc_small_vocab.bin", [i % 97 for i in range(64)])
llmc("llmc_bad_magic.bin", toks[:16], magic=12345)
llmc("llmc_llama3.bin", toks[:16], magic=20240801)
llmc("llmc_bad_version.bin", toks[:16], version=2)
llmc("llmc_count_high.bin", toks[:16], count=17)
llmc("llmc_trailing.bin", toks[:16], extra=b"x")
open(f"{d}/text.txt", "wb").write(b"The quick brown fox jumps over the lazy dog.\n" * 4)
open(f"{d}/text_high_bytes.txt", "wb").write(bytes(range(256)))
PY

# A tiny run: checkpoints (fp32 world 1, bf16 world 1, fp32 world 2), an export, a LoRA adapter.
R=$TMP/r.yaml
cat > "$R" <<'YAML'
model: {n_layer: 1, n_head: 2, d_model: 8, vocab_size: 256, max_seq_len: 16}
data: {format: text, train: [/usr/share/games/fortunes/fortunes], val_fraction: 0.0, seq_len: 8}
batch: {micro: 2}
optimizer: {lr: 1.0e-3}
steps: 2
checkpoint: {every: 2}
logging: {every: 1, sample_tokens: 0}
YAML
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
q() { "$@" > "$TMP/log" 2>&1 || { cat "$TMP/log"; exit 1; }; }
q "$FDTRAIN" train "$R" --run-dir "$TMP/fp32" --no-progress
q "$FDTRAIN" train "$R" precision=bf16 --run-dir "$TMP/bf16" --no-progress
q "$FDTRAIN" train "$R" precision=fp16 --run-dir "$TMP/fp16" --no-progress
q mpirun --oversubscribe --bind-to none -n 2 "$FDTRAIN" train "$R" zero.stage=3 --run-dir "$TMP/w2" --no-progress
# Real shards: seeds for FDFUZZ_HDF5=1 runs (raw HDF5 through our reader; tests/fuzz/run.sh).
cp "$TMP/fp32/checkpoints/step_00000002/rank_00000.h5" "$C/shard_hdf5/fp32_world1.h5"
cp "$TMP/bf16/checkpoints/step_00000002/rank_00000.h5" "$C/shard_hdf5/bf16_world1.h5"
cp "$TMP/fp16/checkpoints/step_00000002/rank_00000.h5" "$C/shard_hdf5/fp16_world1.h5"
cp "$TMP/w2/checkpoints/step_00000002/rank_00001.h5" "$C/shard_hdf5/fp32_world2_rank1.h5"
# Described shards (shard_fuzz.cc's input): one that decodes to a
# valid one-segment shard (byte by byte as write_described_shard() reads it),
# and a few byte strings.
python3 - "$C/shard" <<'PY'
import random, sys
valid = bytes([1, 1,                                    # format_version present, = 1
               4, 2, 4, 1, 4, 0, 4, 0, 4, 2, 4, 7, 4, 0,  # step 2, world 1, rank 0, stage 0, ...
               2, 0, 2, 0, 2, 0,                        # precision fp32, version, recipe
               1, 1,                                    # no base_sha256, no loss scale
               1, 1, 1,                                 # /layout: 1 row, width 1
               1, 0, 1, 1, 0, 1,                        # names [wte.weight], segments [embed]
               1, 1,                                    # both string datasets written
               5] + [0] * 8 +                           # offset [0]
              [5, 1, 0, 0, 0] + [5, 1] +               # ndim [1], decay [1]
              [1, 16] +                                 # shape [[16]]
              [1, 1, 0, 16, 0, 16, 1] +                 # /segments: embed, numel 16, [0, 16)
              ([5] + [0] * 64) * 3 +                    # master, exp_avg, exp_avg_sq
              [0, 1, 0])                                # no params; manifest numel as is; no extra
open(f"{sys.argv[1]}/described_valid", "wb").write(valid)
rng = random.Random(11)
for i in range(8):
    data = bytes(rng.choice([0, 1, 2, 4, 7, 16, 200, 255, rng.randrange(256)]) for _ in range(64 + 48 * i))
    open(f"{sys.argv[1]}/described_{i}", "wb").write(data)
PY

q "$FDTRAIN" ckpt export "$TMP/fp32" --out "$C/safetensors/export_f32.safetensors"
q "$FDTRAIN" ckpt export "$TMP/fp32" --out "$TMP/export_bf16.safetensors" --dtype bf16
cp "$TMP/export_bf16.safetensors" "$C/safetensors/export_bf16.safetensors"
python3 - "$C/safetensors" <<'PY'
import json, struct, sys
d = sys.argv[1]
def st(name, header, data=b""):
    h = json.dumps(header).encode()
    open(f"{d}/{name}", "wb").write(struct.pack("<Q", len(h)) + h + data)
st("empty_header.safetensors", {})
st("metadata_only.safetensors", {"__metadata__": {"format": "pt"}})
st("i32_scalar.safetensors", {"x": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}, b"\1\0\0\0")
st("zero_dim.safetensors", {"z": {"dtype": "F16", "shape": [0, 3], "data_offsets": [0, 0]}})
st("two.safetensors", {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                      "b": {"dtype": "F64", "shape": [1], "data_offsets": [4, 12]}}, bytes(12))
PY

q "$FDTRAIN" ckpt export "$TMP/fp32" --out "$TMP/base.safetensors"
L=(model.init_from="$TMP/base.safetensors" "lora={r: 2, alpha: 4, targets: [c_attn, c_proj]}")
q "$FDTRAIN" train "$R" "${L[@]}" --run-dir "$TMP/lora" --no-progress
q "$FDTRAIN" ckpt export "$TMP/lora" --lora-adapter "$TMP/adapter"
cp "$TMP/lora/checkpoints/step_00000002/rank_00000.h5" "$C/shard_hdf5/lora_world1.h5"
peft() {  # peft NAME CONFIG-FILE MODEL-FILE
  { cat "$2"; printf '\0'; cat "$3"; } > "$C/peft/$1"
}
peft adapter "$TMP/adapter/adapter_config.json" "$TMP/adapter/adapter_model.safetensors"
q "$FDTRAIN" train "$R" model.init_from="$TMP/base.safetensors" \
  "lora={r: 1, alpha: 2, targets: [c_fc, mlp.c_proj], layers: [0]}" --run-dir "$TMP/lora2" --no-progress
q "$FDTRAIN" ckpt export "$TMP/lora2" --lora-adapter "$TMP/adapter2" --dtype bf16
peft adapter_mlp_bf16 "$TMP/adapter2/adapter_config.json" "$TMP/adapter2/adapter_model.safetensors"
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.update(use_dora=True); print(json.dumps(c))' \
  "$TMP/adapter/adapter_config.json" > "$TMP/dora.json"
peft adapter_dora "$TMP/dora.json" "$TMP/adapter/adapter_model.safetensors"
printf '{"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["c_attn"], "fan_in_fan_out": true}' > "$TMP/min.json"
peft config_only "$TMP/min.json" /dev/null

du -sh "$C"
for t in recipe token_file tokenizer safetensors peft shard shard_hdf5 hf_config hf_index \
  sft_records tokenizer_config chat_messages; do echo "$t: $(ls "$C/$t" | wc -l) files"; done
