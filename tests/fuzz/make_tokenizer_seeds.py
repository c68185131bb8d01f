#!/usr/bin/env python3
"""Seeds for tokenizer_fuzz.cc: small tokenizer.json files covering every component
fdtrain implements, each followed by a NUL and a text to encode.
Usage: make_tokenizer_seeds.py OUT_DIR (make_seeds.sh calls it)."""
import json
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
base = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [
        {"id": 6, "content": "<eos>", "special": True, "lstrip": True, "rstrip": False,
         "single_word": False, "normalized": False},
        {"id": 7, "content": "cat", "special": False, "single_word": True, "normalized": True,
         "lstrip": False, "rstrip": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<eos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<eos>": {"id": "<eos>", "ids": [6], "tokens": ["<eos>"]}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": True,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120a": 4, "\u0120ab": 5},
              "merges": ["a b", "\u0120 a", "\u0120a b"]}}
seeds = {"byte_level": (base, "ab aab <eos> cat concat \u00e9\u0301 \u00ff")}
sp = json.loads(json.dumps(base))
sp["normalizer"] = {"type": "Sequence", "normalizers": [
    {"type": "NFC"}, {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
sp["pre_tokenizer"] = None
sp["decoder"] = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
sp["model"] = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "byte_fallback": True,
               "fuse_unk": True,
               "vocab": {"<unk>": 0, "<0x41>": 1, "<0xC3>": 2, "<0xA9>": 3, "\u2581": 4, "a": 5,
                         "\u2581a": 8},
               "merges": [["\u2581", "a"]]}
seeds["sentencepiece"] = (sp, "a a  \u00e9 A\tz <eos>a")
ms = json.loads(json.dumps(sp))
ms["normalizer"] = None
ms["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "Split", "pattern": {"Regex": "(?i:'s)|\\s+(?!\\S)|\\p{L}+"},
     "behavior": "MergedWithNext", "invert": False},
    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
ms["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}
seeds["metaspace_digits"] = (ms, "it's 2024  a a\n\n\u0661\u0662")
for name, (j, text) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(json.dumps(j).encode() + b"\0" + text.encode())
with open(os.path.join(out, "not_json"), "wb") as f:
    f.write(b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [}\0a')
