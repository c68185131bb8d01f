#!/usr/bin/python3
"""Writes recipes/data/debian_prefs.jsonl: a small preference set (TRL's conversational
preference format) for recipes/dpo_lora.yaml, built from recipes/data/debian_chat.jsonl (the
chat fine-tuning set made from this machine's manual pages by make_debian_chat.py).

Each record asks one question of the chat set about a command and pairs the answer the chat set
gives (chosen) with a wrong one (rejected): the description of another command, said of this
one. Some records carry a system message in the prompt; a share are written in TRL's standard
(plain text) shape instead, so both shapes are exercised. Pairs whose prompt and longer answer
take more than --max-tokens chatml-bytes tokens are left out (dpo_lora's rows of 256 positions
hold a pair's two sequences of at most 129 tokens each):

  {"prompt": [{"role": "user", "content": "What does the ls command do?"}],
   "chosen": [{"role": "assistant", "content": "ls is a command to list directory contents."}],
   "rejected": [{"role": "assistant", "content": "ls is a command to copy files."}]}

Deterministic (fixed seed); the output is committed.

    /usr/bin/python3 recipes/data/make_debian_prefs.py  [--max N]
"""
import argparse
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))


def exchanges(path):
    """(system or None, earlier turns, question, answer, command name) for every answered
    question of the chat set."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if "messages" in rec:
                msgs = rec["messages"]
            else:
                role = {"human": "user", "gpt": "assistant", "system": "system"}
                msgs = [{"role": role[m["from"]], "content": m["value"]}
                        for m in rec["conversations"]]
            system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
            turns = [m for m in msgs if m["role"] != "system"]
            for i in range(0, len(turns) - 1, 2):
                q, a = turns[i], turns[i + 1]
                if q["role"] != "user" or a["role"] != "assistant":
                    continue
                name = a["content"].split(":")[0].split(" ")[0]
                if name.lower() in ("the",):
                    name = a["content"].split(" ")[1]
                yield system, turns[:i], q["content"], a["content"], name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=640, help="pairs to write")
    ap.add_argument("--standard", type=float, default=0.15,
                    help="share of pairs in TRL's standard (text) shape")
    ap.add_argument("--max-tokens", type=int, default=128,
                    help="longest prompt + answer, in chatml-bytes tokens")
    ap.add_argument("--chat", default=os.path.join(HERE, "debian_chat.jsonl"))
    ap.add_argument("--out", default=os.path.join(HERE, "debian_prefs.jsonl"))
    args = ap.parse_args()
    rng = random.Random(20261206)
    ex = [e for e in exchanges(args.chat) if e[4] and e[4] in e[3]]
    out = []
    for system, earlier, question, answer, name in ex:
        if len(out) >= args.max:
            break
        # A wrong answer: another command's answer, said of this one.
        other = rng.choice(ex)
        if other[4] == name:
            continue
        wrong = other[3].replace(other[4], name, 1)
        if wrong == answer:
            continue
        prompt = [{"role": "system", "content": system}] if system else []
        prompt.append({"role": "user", "content": question})
        # ChatML in chatml-bytes tokens: <|im_start|>role\ncontent<|im_end|>\n per message, the
        # generation prompt, the answer and its <|im_end|>\n.
        length = sum(3 + len(m["role"]) + len(m["content"].encode()) for m in prompt) + 11
        if length + max(len(answer.encode()), len(wrong.encode())) + 2 > args.max_tokens:
            continue
        if rng.random() < args.standard:
            out.append({"prompt": f"Question: {question}\nAnswer:", "chosen": " " + answer,
                        "rejected": " " + wrong})
            continue
        out.append({"prompt": prompt,
                    "chosen": [{"role": "assistant", "content": answer}],
                    "rejected": [{"role": "assistant", "content": wrong}]})
    with open(args.out, "w", encoding="utf-8") as f:
        for rec in out:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(out)} pairs from {len(ex)} answered questions")


if __name__ == "__main__":
    main()
