"""PyTorch eager peer of bench/train_bench.cc: the same models (GPT-2 configs S, M,
124M; the Llama-family config Llama-S), data shapes and AdamW step (forward,
backward, clip_grad_norm_, AdamW), timed the same way.

The Llama model is written here in plain PyTorch, as Hugging Face's
LlamaForCausalLM computes it (eager attention): LlamaRMSNorm, RoPE with cached
cos/sin and rotate_half, GQA by repeating k/v heads (HF's repeat_kv), SwiGLU MLP
down(silu(gate(x)) * up(x)), untied lm_head, F.cross_entropy. No torch.compile.

Run with Debian's interpreter (python3-torch), both thread counts pinned:
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peer/torch_gpt.py S M Llama-S
"""
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # name: (n_layer, n_head, d_model, vocab, max_seq_len, batch, seq_len)
    "S": (4, 4, 256, 256, 256, 8, 256),
    "M": (6, 8, 512, 256, 256, 4, 256),
    "124M": (12, 12, 768, 50257, 1024, 1, 1024),  # batch 1: seconds per step on a CPU
}
LLAMA_CONFIGS = {  # name: (layers, hidden, heads, kv_heads, intermediate, vocab, batch, seq_len)
    "Llama-S": (6, 512, 8, 2, 1408, 32000, 4, 256),
}


class Conv1D(nn.Module):
    """Hugging Face GPT-2 Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, n_in, n_out, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * std)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class Block(nn.Module):
    def __init__(self, c, h, n_layer):
        super().__init__()
        resid = 0.02 / math.sqrt(2 * n_layer)
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = Conv1D(c, 3 * c, 0.02), Conv1D(c, c, resid)
        self.c_fc, self.mlp_proj = Conv1D(c, 4 * c, 0.02), Conv1D(4 * c, c, resid)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.h))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, H, C, V, T):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(V, C) * 0.02)
        self.wpe = nn.Parameter(torch.randn(T, C) * 0.02)
        self.h = nn.ModuleList(Block(C, H, L) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, tokens, targets):
        T = tokens.size(1)
        x = self.wte[tokens] + self.wpe[:T]
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LlamaRMSNorm(nn.Module):
    """As transformers' LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, times w."""

    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def linear(n_in, n_out):
    """nn.Linear without bias, initialised N(0, 0.02) as LlamaPreTrainedModel does."""
    m = nn.Linear(n_in, n_out, bias=False)
    nn.init.normal_(m.weight, std=0.02)
    return m


class LlamaBlock(nn.Module):
    def __init__(self, hidden, heads, kv_heads, intermediate):
        super().__init__()
        self.nh, self.nkv, self.d = heads, kv_heads, hidden // heads
        self.input_layernorm = LlamaRMSNorm(hidden)
        self.post_attention_layernorm = LlamaRMSNorm(hidden)
        self.q_proj, self.k_proj = linear(hidden, heads * self.d), linear(hidden, kv_heads * self.d)
        self.v_proj, self.o_proj = linear(hidden, kv_heads * self.d), linear(heads * self.d, hidden)
        self.gate_proj, self.up_proj = linear(hidden, intermediate), linear(hidden, intermediate)
        self.down_proj = linear(intermediate, hidden)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv  # repeat_kv: kv head j serves query heads j*rep .. j*rep+rep-1
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.nh * self.d)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, hidden, heads, kv_heads, intermediate, V, T, theta=10000.0):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.randn(V, hidden) * 0.02)
        self.layers = nn.ModuleList(LlamaBlock(hidden, heads, kv_heads, intermediate)
                                    for _ in range(L))
        self.norm = LlamaRMSNorm(hidden)
        self.lm_head = linear(hidden, V)
        d = hidden // heads
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)  # (T, D), cached once
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)

    def forward(self, tokens, targets):
        T = tokens.size(1)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        x = self.embed_tokens[tokens]
        for b in self.layers:
            x = b(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def sgemm_gflops(n=2048):
    a, b = torch.full((n, n), 0.5), torch.full((n, n), 0.25)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(3))
    return 2 * n**3 / best / 1e9


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def build(name):
    """(model, vocab, batch, seq_len, FLOPs per token): 6 N + 12 L T nH D, with N the
    parameters that multiply (an untied input embedding is a lookup: not counted),
    as DecoderConfig::flops_per_token."""
    if name in CONFIGS:
        L, H, C, V, Tmax, B, T = CONFIGS[name]
        model = Gpt(L, H, C, V, Tmax)
        n_matmul = sum(p.numel() for p in model.parameters())  # tied head: wte multiplies
        return model, V, B, T, 6 * n_matmul + 12 * L * T * C
    L, C, H, KV, I, V, B, T = LLAMA_CONFIGS[name]
    model = Llama(L, C, H, KV, I, V, T)
    n_matmul = sum(p.numel() for p in model.parameters()) - model.embed_tokens.numel()
    return model, V, B, T, 6 * n_matmul + 12 * L * T * C  # nH * D = C here


def run(name, steps, warmup, peak):
    torch.manual_seed(1)
    model, V, B, T, flops_per_token = build(name)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(p.numel() for p in model.parameters())
    total = 0.0
    for s in range(warmup + steps):
        tokens = torch.randint(0, V, (B, T))
        targets = torch.randint(0, V, (B, T))
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s >= warmup:
            total += time.perf_counter() - t
    ms = total / steps * 1e3
    tok_s = B * T / (ms / 1e3)
    gflops = tok_s * flops_per_token / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{name:<7} {ms:10.1f} {tok_s:10.0f} {gflops:9.1f} {100 * gflops / peak:8.1f}% {rss:9.0f} "
          f"{n_params / 1e6:12.2f}", flush=True)


def main():
    args = sys.argv[1:]
    steps = 5
    if "--steps" in args:
        i = args.index("--steps")
        steps = int(args[i + 1])
        del args[i:i + 2]
    names = args or ["S", "M"]
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    peak = sgemm_gflops()
    print(f"pytorch {torch.__version__} eager: fp32, {torch.get_num_threads()} thread(s), "
          f"{steps} timed steps after 1 warmup")
    print(f"sgemm 2048^3 (torch.matmul): {peak:.1f} GFLOP/s")
    print(f"{'cfg':<7} {'ms/step':>10} {'tok/s':>10} {'GFLOP/s':>9} {'%peak':>9} {'RSS MiB':>9} "
          f"{'params (M)':>12}")
    for n in names:
        if n not in CONFIGS and n not in LLAMA_CONFIGS:
            sys.exit(f"torch_gpt.py: unknown config '{n}' ({', '.join([*CONFIGS, *LLAMA_CONFIGS])})")
        run(n, steps, 1, peak)


if __name__ == "__main__":
    main()
