#!/usr/bin/env python3
"""Two small transformers-format bitsandbytes 4-bit directories written by an
independent writer: Python's json (config.json as transformers' to_json_string
writes it, the quant_state blob as bitsandbytes' pack_dict_to_tensor does) and
a safetensors writer following the safetensors library's layout (tensors sorted
by dtype, descending in its Dtype enum's order, then by name; compact header;
"__metadata__" first; padded with spaces to 8 bytes). The values are arbitrary
but consistent. tests/ckpt/bnb4bit_test.cc reads each and writes it again, and
expects the same bytes. Usage (from the repository root):
    python3 tests/ckpt/make_bnb4bit_python.py tests/ckpt/bnb4bit_python"""
import json
import os
import struct
import sys

out = sys.argv[1]
RANK = {"BOOL": 0, "U8": 1, "I8": 2, "F8_E5M2": 3, "F8_E4M3": 4, "I16": 5, "U16": 6, "F16": 7,
        "BF16": 8, "I32": 9, "U32": 10, "F32": 11, "F64": 12, "I64": 13, "U64": 14}


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def safetensors(tensors, metadata):
    tensors = sorted(tensors, key=lambda t: (-RANK[t[1]], t[0]))
    header, data = {"__metadata__": metadata}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def weight(name, shape, quant_type, blocksize, nested, seed):
    n = 1
    for d in shape:
        n *= d
    blocks = (n + blocksize - 1) // blocksize
    pack = lambda v: struct.pack("<%df" % len(v), *v)
    ts = [(name, "U8", [(n + 1) // 2, 1], bytes((seed + 37 * i) % 256 for i in range((n + 1) // 2)))]
    if nested:
        ts.append((name + ".absmax", "U8", [blocks], bytes((seed * 11 + 3 * i) % 256 for i in range(blocks))))
    else:
        ts.append((name + ".absmax", "F32", [blocks], pack([0.01 * (i + 1) for i in range(blocks)])))
    ts.append((name + ".quant_map", "F32", [16], pack([-1 + i / 7.5 for i in range(16)])))
    state = {"quant_type": quant_type, "blocksize": blocksize, "dtype": "bfloat16", "shape": shape}
    if nested:
        nb = (blocks + 255) // 256
        ts.append((name + ".nested_absmax", "F32", [nb], pack([0.003 * (i + seed) for i in range(nb)])))
        ts.append((name + ".nested_quant_map", "F32", [256], pack([-1 + i / 127.5 for i in range(256)])))
        state.update({"nested_blocksize": 256, "nested_dtype": "float32",
                      "nested_offset": f32(0.0123456789 * seed)})
    blob = json.dumps(state).encode("utf-8")
    ts.append((name + ".quant_state.bitsandbytes__" + quant_type, "U8", [len(blob)], blob))
    return ts


def directory(sub, quant_type, blocksize, nested):
    d = os.path.join(out, sub)
    os.makedirs(d, exist_ok=True)
    qc = {"_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
          "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": quant_type,
          "bnb_4bit_use_double_quant": nested, "llm_int8_enable_fp32_cpu_offload": False,
          "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None,
          "llm_int8_threshold": 6.0, "load_in_4bit": True, "load_in_8bit": False,
          "quant_method": "bitsandbytes"}
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "model_type": "llama",
              "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
              "quantization_config": qc}
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    ts = weight("model.layers.0.self_attn.q_proj.weight", [16, 16], quant_type, blocksize, nested, 1)
    ts += weight("model.layers.0.mlp.down_proj.weight", [16, 45], quant_type, blocksize, nested, 2)
    ts.append(("model.norm.weight", "BF16", [16], bytes([0x80, 0x3F] * 16)))
    ts.append(("lm_head.weight", "BF16", [4, 16], bytes(range(128))))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(safetensors(ts, {"format": "pt"}))


directory("nf4_dq", "nf4", 64, True)
directory("fp4", "fp4", 32, False)
