#!/usr/bin/python3
"""PyTorch reference data for fdtrain's GPT-2 parity tests.

Builds a tiny GPT-2 in plain PyTorch (our own code, no transformers) with
Hugging Face GPT-2 parameter names and layouts, runs one forward/backward on a
fixed batch and 10 AdamW steps on the same batch, and writes everything to
tests/golden/gpt_tiny.safetensors. All arithmetic is float32 on the CPU, one
thread, deterministic algorithms.

It also writes tests/golden/gpt_tiny_bf16.safetensors: the same model and
batch after model.to(torch.bfloat16), one forward/backward in bfloat16 on the
CPU (the loss is cross-entropy in float32 on the bf16 logits, as fdtrain
computes it). Building it draws no random numbers, so the float32 file is the
same bytes whether or not the bf16 file is written.

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 tests/golden/make_golden.py
See tests/golden/README.md for what the file holds.
"""

import copy
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_LAYER = 2
N_HEAD = 3
D_MODEL = 24
VOCAB_SIZE = 67
MAX_SEQ_LEN = 16
BATCH = 3
SEQ = 11
LR = 1e-2
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
STEPS = 10
LN_EPS = 1e-5


class Conv1D(nn.Module):
    """Hugging Face GPT-2's Conv1D: weight is (in, out), y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = Conv1D(D_MODEL, 3 * D_MODEL)
        self.c_proj = Conv1D(D_MODEL, D_MODEL)

    def forward(self, x):
        b, t, c = x.shape
        hs = c // N_HEAD
        q, k, v = self.c_attn(x).split(c, dim=2)  # output columns are q | k | v
        # Head h uses columns h*hs:(h+1)*hs of each of q, k, v.
        q = q.view(b, t, N_HEAD, hs).transpose(1, 2)
        k = k.view(b, t, N_HEAD, hs).transpose(1, 2)
        v = v.view(b, t, N_HEAD, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(D_MODEL, 4 * D_MODEL)
        self.c_proj = Conv1D(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(D_MODEL, eps=LN_EPS)
        self.mlp = Mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB_SIZE, D_MODEL)
        self.wpe = nn.Embedding(MAX_SEQ_LEN, D_MODEL)
        self.h = nn.ModuleList([Block() for _ in range(N_LAYER)])
        self.ln_f = nn.LayerNorm(D_MODEL, eps=LN_EPS)

    def forward(self, tokens):
        _, t = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t()  # lm head tied to wte, no bias


def is_ln(name):
    return ".ln_" in name or name.startswith("ln_")


def init_(model):
    """GPT-2 init, then small noise on biases and LayerNorm params."""
    std_resid = 0.02 / math.sqrt(2 * N_LAYER)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_ln(name):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            elif name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
                p.normal_(0.0, std_resid)
            else:
                p.normal_(0.0, 0.02)
        for name, p in model.named_parameters():
            if is_ln(name) or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.02)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.view(-1, VOCAB_SIZE), targets.view(-1), ignore_index=-1)


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer: tensors is a list of (name, torch.Tensor)."""
    dtypes = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16"}
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().contiguous()
        # numpy has no bfloat16: write its raw 16-bit patterns.
        arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * ((8 - len(header_bytes) % 8) % 8)  # pad like the reference library
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def bf16_golden(model, tokens, targets):
    """One forward/backward of `model` (already bfloat16) on the batch.

    Returns the tensors of gpt_tiny_bf16.safetensors: parameters (BF16), the
    batch (I32), logits (F32, exactly the bf16 values), loss (F32) and every
    parameter gradient (BF16, exactly torch's bf16 .grad).
    """
    params = list(model.named_parameters())
    out = [(name, p.detach().clone()) for name, p in params]
    out.append(("batch.tokens", tokens.to(torch.int32)))
    out.append(("batch.targets", targets.to(torch.int32)))
    logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    # Cross-entropy in float32 on the bf16 logits (fdtrain's loss is fp32
    # whatever the logits dtype); its gradient reaches the logits as bf16.
    loss = loss_fn(logits.float(), targets)
    loss.backward()
    out.append(("out.logits", logits.detach().float()))
    out.append(("out.loss", loss.detach().reshape(1).clone()))
    for name, p in params:
        assert p.grad.dtype == torch.bfloat16, name
        out.append(("grad." + name, p.grad.detach().clone()))
    return out, loss.item()


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    model = Gpt()
    init_(model)
    params = list(model.named_parameters())
    # The bf16 model: the initial parameters rounded to nearest even.
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)

    gen = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB_SIZE, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, VOCAB_SIZE, (BATCH, SEQ), generator=gen)
    targets[0, 3] = -1
    targets[2, SEQ - 1] = -1

    out = []
    for name, p in params:
        out.append((name, p.detach().clone()))
    out.append(("batch.tokens", tokens.to(torch.int32)))
    out.append(("batch.targets", targets.to(torch.int32)))

    logits = model(tokens)
    loss = loss_fn(logits, targets)
    loss.backward()
    out.append(("out.logits", logits.detach().clone()))
    out.append(("out.loss", loss.detach().reshape(1).clone()))
    for name, p in params:
        out.append(("grad." + name, p.grad.detach().clone()))

    decay = [p for _, p in params if p.dim() == 2]
    no_decay = [p for _, p in params if p.dim() != 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
        eps=EPS,
    )
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model(tokens), targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], GRAD_CLIP)
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
    out.append(("adamw.losses", torch.tensor(losses, dtype=torch.float32)))
    out.append(("adamw.grad_norms", torch.tensor(norms, dtype=torch.float32)))
    for name, p in params:
        out.append(("final." + name, p.detach().clone()))

    metadata = {
        "format": "pt",
        "n_layer": json.dumps(N_LAYER),
        "n_head": json.dumps(N_HEAD),
        "d_model": json.dumps(D_MODEL),
        "vocab_size": json.dumps(VOCAB_SIZE),
        "max_seq_len": json.dumps(MAX_SEQ_LEN),
        "B": json.dumps(BATCH),
        "T": json.dumps(SEQ),
        "lr": json.dumps(LR),
        "betas": json.dumps(list(BETAS)),
        "eps": json.dumps(EPS),
        "weight_decay": json.dumps(WEIGHT_DECAY),
        "weight_decay_applies_to": "2-D parameters (wte, wpe, c_attn/c_proj/c_fc weights)",
        "grad_clip": json.dumps(GRAD_CLIP),
        "steps": json.dumps(STEPS),
        "ln_eps": json.dumps(LN_EPS),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "gpt_tiny.safetensors")
    write_safetensors(path, out, metadata)
    print(f"wrote {path}: {len(out)} tensors, loss {losses[0]:.6f} -> {losses[-1]:.6f}")

    out_bf16, loss_bf16 = bf16_golden(model_bf16, tokens, targets)
    meta_bf16 = {k: metadata[k] for k in ("format", "n_layer", "n_head", "d_model", "vocab_size",
                                          "max_seq_len", "B", "T", "ln_eps", "torch_version",
                                          "numpy_version")}
    meta_bf16["dtype"] = "bfloat16"
    meta_bf16["loss"] = "F.cross_entropy(logits.float(), targets, ignore_index=-1)"
    meta_bf16["grads"] = "BF16, torch's bf16 .grad"
    path = os.path.join(here, "gpt_tiny_bf16.safetensors")
    write_safetensors(path, out_bf16, meta_bf16)
    print(f"wrote {path}: {len(out_bf16)} tensors, loss {loss_bf16:.6f}")


if __name__ == "__main__":
    main()
