#!/usr/bin/python3
"""Writes recipes/tokenizers/chatml-bytes/: a Hugging Face tokenizer (tokenizer.json +
tokenizer_config.json) for the chat fine-tuning demo: byte-level BPE with no merges (token
id b is byte b, as in fdtrain's byte-level recipes) plus ChatML's special tokens
<|im_start|> (256), <|im_end|> (257) and <|endoftext|> (258), and the ChatML chat template
(as SmolLM2 and Qwen ship it, without a default system message). eos_token is <|im_end|>,
so pre-training documents end with it and a chat model stops at it.

It is a complete tokenizer.json: Hugging Face's tokenizers load it as they load GPT-2's
(tests/text/hf_tokenizer_test.cc compares fdtrain's encodings of it with theirs).

    /usr/bin/python3 recipes/tokenizers/make_chatml_bytes.py
"""
import json
import os


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (byte-level BPE's alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CHATML = ("{%- for message in messages -%}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
          "'\\n' -}}"
          "{%- endfor -%}"
          "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chatml-bytes")
    os.makedirs(out, exist_ok=True)
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    added = []
    for i, tok in enumerate(SPECIAL):
        vocab[tok] = 256 + i
        added.append({"id": 256 + i, "content": tok, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    config = {
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 256,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHATML,
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"{out}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
