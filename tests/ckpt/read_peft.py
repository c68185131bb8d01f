#!/usr/bin/env python3
"""An independent reader of a PEFT LoRA adapter directory (json and struct only).

Usage: read_peft.py DIR
Reads DIR/adapter_config.json and DIR/adapter_model.safetensors and checks
them against Hugging Face PEFT's conventions for GPT-2:
  - the config has peft_type "LORA", task_type "CAUSAL_LM", an integer r,
    lora_alpha, lora_dropout, target_modules (a list), bias "none",
    fan_in_fan_out true, base_model_name_or_path, inference_mode true;
  - every key is base_model.model.transformer.h.N.<module>.lora_A.weight
    (shape r x in) or .lora_B.weight (shape out x r), A and B in pairs, the
    module named by target_modules with PEFT's suffix rule;
  - the safetensors header is well formed (offsets in range, contiguous,
    sizes = numel x dtype size).
Prints "config<TAB>key<TAB>json value" per config key (sorted), then
"tensor<TAB>key<TAB>dtype<TAB>shape<TAB>sum" per tensor in file order (shape
comma-separated, sum the float64 sum of the values, repr). Exit 1 with a
message naming the problem otherwise.
"""
import json
import os
import re
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2}
KEY = re.compile(r"^base_model\.model\.transformer\.h\.(\d+)\."
                 r"(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.lora_([AB])\.weight$")


def fail(msg):
    sys.exit("read_peft.py: " + msg)


def values(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "F32":
        return struct.unpack("<%df" % n, raw)
    if dtype == "F16":
        return struct.unpack("<%de" % n, raw)
    halves = struct.unpack("<%dH" % n, raw)
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]


def targeted(targets, module):
    return any(module == t or module.endswith("." + t) for t in targets)


def main(d):
    cfg_path = os.path.join(d, "adapter_config.json")
    st_path = os.path.join(d, "adapter_model.safetensors")
    with open(cfg_path) as f:
        cfg = json.load(f)
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none",
            "fan_in_fan_out": True, "inference_mode": True}
    for k, v in want.items():
        if cfg.get(k) != v:
            fail("%s: %s is %r, expected %r" % (cfg_path, k, cfg.get(k), v))
    r = cfg.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        fail("%s: r is %r" % (cfg_path, r))
    for k in ("lora_alpha", "lora_dropout"):
        if not isinstance(cfg.get(k), (int, float)):
            fail("%s: %s is %r" % (cfg_path, k, cfg.get(k)))
    targets = cfg.get("target_modules")
    if not isinstance(targets, list) or not targets:
        fail("%s: target_modules is %r" % (cfg_path, targets))
    if "base_model_name_or_path" not in cfg:
        fail("%s: no base_model_name_or_path" % cfg_path)
    layers = cfg.get("layers_to_transform")

    with open(st_path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    header.pop("__metadata__", None)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos = 0
    pairs = {}
    lines = []
    for key, e in entries:
        m = KEY.match(key)
        if not m:
            fail("%s: key %s is not a PEFT GPT-2 LoRA key" % (st_path, key))
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        begin, end = e["data_offsets"]
        shape = e["shape"]
        if e["dtype"] not in SIZES or len(shape) != 2 or begin != pos or end > len(data) or \
                end - begin != shape[0] * shape[1] * SIZES[e["dtype"]]:
            fail("%s: tensor %s: bad dtype, shape or offsets" % (st_path, key))
        pos = end
        if ab == "A" and shape[0] != r:
            fail("%s: %s has shape %s, expected (r=%d, in)" % (st_path, key, shape, r))
        if ab == "B" and shape[1] != r:
            fail("%s: %s has shape %s, expected (out, r=%d)" % (st_path, key, shape, r))
        if not targeted(targets, module):
            fail("%s: %s is not named by target_modules %s" % (st_path, key, targets))
        if layers is not None and layer not in layers:
            fail("%s: %s is not in layers_to_transform %s" % (st_path, key, layers))
        pairs.setdefault((layer, module), {})[ab] = shape
        total = 0.0
        for v in values(e["dtype"], data[begin:end]):
            total += float(v)
        lines.append("tensor\t%s\t%s\t%s\t%r" % (key, e["dtype"], ",".join(map(str, shape)),
                                                 total))
    if pos != len(data):
        fail("%s: %d bytes after the last tensor" % (st_path, len(data) - pos))
    for (layer, module), p in sorted(pairs.items()):
        if set(p) != {"A", "B"}:
            fail("%s: h.%d.%s has only lora_%s" % (st_path, layer, module, "".join(p)))
    for k in sorted(cfg):
        print("config\t%s\t%s" % (k, json.dumps(cfg[k])))
    for line in lines:
        print(line)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
