#!/usr/bin/python3
"""Writes recipes/data/debian_chat.jsonl: a small chat fine-tuning set built from
the NAME lines of the machine's section-1 manual pages ("ls - list directory
contents"), for recipes/sft_chat_lora.yaml.

Each record is {"messages": [...]}: one to three question/answer turns about
commands ("What does the ls command do?" -> "ls lists directory contents."),
some with a system message, some in ShareGPT's spelling ({"conversations":
[{"from": "human", ...}]}) so that both shapes are exercised. Deterministic for
a given set of manual pages (sorted, fixed seed); the output is committed, so
runs do not depend on what a machine has installed.

    /usr/bin/python3 recipes/data/make_debian_chat.py  [--max N]
"""
import argparse
import glob
import gzip
import json
import os
import random
import re

SYSTEM = [
    "You answer questions about Debian commands in one sentence.",
    "You are a concise assistant for Debian users.",
]
QUESTIONS = [
    "What does the {name} command do?",
    "What is {name} for?",
    "Explain {name} in one sentence.",
    "I found {name} on my Debian system. What is it?",
]
ANSWERS = [
    "{name}: {desc}.",
    "{name} is a command to {desc_lc}.",
    "The {name} command is used to {desc_lc}.",
]


def clean(text):
    for a, b in [("\\-", "-"), ("\\(em", "-"), ("\\(en", "-"), ("\\fB", ""), ("\\fR", ""),
                 ("\\fI", ""), ("\\fP", ""), ("\\ ", " "), ("\\&", ""), ("\\e", "\\")]:
        text = text.replace(a, b)
    text = re.sub(r"\\[a-zA-Z(][^ ]*", "", text)
    return " ".join(text.split())


def name_lines(pattern):
    seen = set()
    for path in sorted(glob.glob(pattern)):
        try:
            head = gzip.open(path, "rt", errors="replace").read(6000)
        except OSError:
            continue
        m = re.search(r'\.S[Hh]\s+"?NAME"?\s*\n(.*?)\n\.(SH|Sh|SS)', head, re.S)
        if not m:
            continue
        line = clean(" ".join(l for l in m.group(1).split("\n") if not l.startswith(".")))
        if " - " not in line:
            continue
        names, desc = line.split(" - ", 1)
        name = names.split(",")[0].strip()
        desc = desc.strip().rstrip(".")
        if (not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,30}", name) or name in seen
                or len(desc) < 8 or len(desc) > 160 or "manual page" in desc.lower()
                or not desc.isascii()):
            continue
        seen.add(name)
        yield name, desc


def chatml_tokens(messages):
    """Tokens of the conversation in ChatML with recipes/tokenizers/chatml-bytes: each special
    token is one, every other byte one."""
    return sum(3 + len(m["role"]) + len(m["content"].encode()) + 1 for m in messages)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=1500, help="conversations to write")
    ap.add_argument("--max-tokens", type=int, default=256,
                    help="longest conversation, in chatml-bytes tokens (sft_chat_lora's seq_len)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "debian_chat.jsonl"))
    args = ap.parse_args()
    rng = random.Random(20261202)
    pairs = list(name_lines("/usr/share/man/man1/*.1.gz"))
    rng.shuffle(pairs)
    out = []
    i = 0
    while i < len(pairs) and len(out) < args.max:
        turns = rng.choice([1, 1, 1, 2, 3])
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(SYSTEM)})
        used = 0
        for name, desc in pairs[i:i + turns]:
            desc_lc = desc[0].lower() + desc[1:] if not desc[:2].isupper() else desc
            messages.append({"role": "user", "content": rng.choice(QUESTIONS).format(name=name)})
            if re.match(r"(a|an|the) ", desc_lc):  # a noun phrase: "X is a tool to ..."
                answer = rng.choice(["{name} is {desc_lc}.", "{name}: {desc}."])
            else:  # a verb phrase: "list directory contents"
                answer = rng.choice(ANSWERS)
            messages.append({"role": "assistant",
                             "content": answer.format(name=name, desc=desc, desc_lc=desc_lc)})
            used += 1
            if chatml_tokens(messages) > args.max_tokens:  # too long: drop this exchange
                del messages[-2:]
                break
        i += max(used, 1)
        if not any(m["role"] == "assistant" for m in messages):
            continue
        if rng.random() < 0.2 and messages[0]["role"] != "system":
            spell = {"user": "human", "assistant": "gpt"}
            out.append({"conversations": [{"from": spell[m["role"]], "value": m["content"]}
                                          for m in messages]})
        else:
            out.append({"messages": messages})
    with open(args.out, "w", encoding="utf-8") as f:
        for rec in out:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(out)} conversations from {len(pairs)} manual pages")


if __name__ == "__main__":
    main()
