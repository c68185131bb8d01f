#!/usr/bin/python3
"""PyTorch reference data for fdtrain's Llama-family parity tests.

A self-contained decoder in plain PyTorch (our own code, no transformers) with
the semantics of Hugging Face's Llama / Mistral / Qwen2 / Qwen3 models
(modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py,
modeling_rope_utils.py) and their parameter names and layouts. For each case
in CASES it writes tests/golden/llama/<case>/:

  config.json        the model's config as Hugging Face writes it
  model.safetensors  the initial parameters, Hugging Face names
  golden.safetensors a batch, logits, loss and every gradient (float32), and
                     the mean loss over the windows of eval.bin
  eval.bin           an llm.c token file (uint16) for `fdtrain eval`

All arithmetic is float32 on the CPU, one thread, deterministic algorithms.
Each case is also recomputed in float64 to measure how far float32 is from
the exact result (printed; recorded in tests/golden/README.md).

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 tests/golden/make_golden_llama.py
See tests/golden/README.md for what the files hold.
"""

import os

# OpenBLAS picks its GEMM kernels by CPU, and their summation order shows in
# the last bits of the logits and gradients: the committed files were made with
# the Haswell (AVX2) kernels, which any x86-64 with AVX2 runs.
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import struct  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BATCH = 3
SEQ = 11
IGNORE = -1  # fdtrain's ignore index for targets
EVAL_SEQ_LEN = 16
EVAL_WINDOWS = 3
EVAL_EXTRA = 4  # tokens after the last whole window, which fdtrain eval ignores
LLMC_MAGIC = 20240520
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256

# The cases. Keys are Hugging Face config.json fields; `head_dim` is written
# only where the family's config has it.
CASES = {
    "llama3": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "head_dim": 8,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 88,
        "max_position_embeddings": 64,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": 97,
    },
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "max_window_layers": 2,
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 101,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 89,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 72,
        "max_position_embeddings": 64,
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": 83,
    },
}


class Arch:
    """What the decoder needs from a config.json, with each family's defaults."""

    def __init__(self, cfg):
        t = cfg["model_type"]
        self.model_type = t
        self.hidden = cfg["hidden_size"]
        self.n_layer = cfg["num_hidden_layers"]
        self.n_head = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        # HF: getattr(config, "head_dim", None) or hidden_size // num_attention_heads.
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_head
        self.inter = cfg["intermediate_size"]
        self.vocab = cfg["vocab_size"]
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]
        self.rope_scaling = cfg.get("rope_scaling")
        self.tied = cfg["tie_word_embeddings"]
        # q/k/v bias: Qwen2 always; Llama and Qwen3 iff attention_bias; Mistral never.
        # o_proj bias: Llama and Qwen3 iff attention_bias; Qwen2 and Mistral never.
        bias = cfg.get("attention_bias", False)
        self.qkv_bias = True if t == "qwen2" else (bias and t in ("llama", "qwen3"))
        self.o_bias = bias and t in ("llama", "qwen3")
        self.mlp_bias = cfg.get("mlp_bias", False) and t == "llama"
        self.qk_norm = t == "qwen3"
        assert self.n_head % self.n_kv == 0


def rope_inv_freq(a):
    """inv_freq as modeling_rope_utils computes it, in float32 like HF.

    default: 1 / theta ** (arange(0, D, 2, int64).float() / D), float32
    throughout (the Python float theta meets a float32 tensor).
    linear: default / factor. llama3: _compute_llama3_parameters on the float32
    default frequencies.
    """
    d = a.head_dim
    inv_freq = 1.0 / (a.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = a.rope_scaling
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind == "llama3":
        factor = rs["factor"]
        low_ff = rs["low_freq_factor"]
        high_ff = rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        low_freq_wavelen = old_ctx / low_ff
        high_freq_wavelen = old_ctx / high_ff
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_type {kind!r} is not implemented here")


def llama3_inv_freq_direct(d, theta, rs):
    """The llama3 formula written out per frequency in float64 (the self-check)."""
    out = []
    old_ctx = rs["original_max_position_embeddings"]
    lo, hi, factor = rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    for i in range(0, d, 2):
        f = theta ** (-i / d)
        wl = 2 * math.pi / f
        if wl < old_ctx / hi:  # high frequency: kept
            out.append(f)
        elif wl > old_ctx / lo:  # low frequency: interpolated by factor
            out.append(f / factor)
        else:  # in between: blended
            s = (old_ctx / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return out


def rope_cos_sin(inv_freq, t, dtype):
    """cos, sin (T, D) like LlamaRotaryEmbedding.forward: float32, then to dtype.

    In the float64 reference (dtype float64) the angles and cos/sin are taken
    in float64 from the same float32 inv_freq.
    """
    work = torch.float32 if dtype == torch.float32 else torch.float64
    pos = torch.arange(t, dtype=work)
    freqs = pos[:, None] * inv_freq.to(work)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    """LlamaRMSNorm: weight * (x * rsqrt(mean(x^2) + eps)).

    HF computes in float32 and casts back; here the arithmetic is in the input
    dtype, the same for float32 and exact-er for the float64 reference.
    """

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class Attention(nn.Module):
    # Submodules in HF's __init__ order, so named_parameters() is in HF order.
    def __init__(self, a):
        super().__init__()
        self.a = a
        d = a.head_dim
        self.q_proj = nn.Linear(a.hidden, a.n_head * d, bias=a.qkv_bias)
        self.k_proj = nn.Linear(a.hidden, a.n_kv * d, bias=a.qkv_bias)
        self.v_proj = nn.Linear(a.hidden, a.n_kv * d, bias=a.qkv_bias)
        self.o_proj = nn.Linear(a.n_head * d, a.hidden, bias=a.o_bias)
        if a.qk_norm:
            self.q_norm = RMSNorm(d, a.eps)
            self.k_norm = RMSNorm(d, a.eps)

    def forward(self, x, cos, sin):
        a = self.a
        b, t, _ = x.shape
        d = a.head_dim
        q = self.q_proj(x).view(b, t, a.n_head, d)
        k = self.k_proj(x).view(b, t, a.n_kv, d)
        v = self.v_proj(x).view(b, t, a.n_kv, d)
        if a.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = self.q_norm(q)
            k = self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: key/value head j serves query heads j*g .. j*g + g - 1.
        g = a.n_head // a.n_kv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        att = (q @ k.transpose(-2, -1)) * (d**-0.5)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, a.n_head * d)
        return self.o_proj(y)


class Mlp(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden, a.inter, bias=a.mlp_bias)
        self.up_proj = nn.Linear(a.hidden, a.inter, bias=a.mlp_bias)
        self.down_proj = nn.Linear(a.inter, a.hidden, bias=a.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = Mlp(a)
        self.input_layernorm = RMSNorm(a.hidden, a.eps)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList([DecoderLayer(a) for _ in range(a.n_layer)])
        self.norm = RMSNorm(a.hidden, a.eps)


class ForCausalLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.model = Model(a)
        if not a.tied:
            self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        # Computed once in float32 like HF's inv_freq buffer; not a parameter.
        self.inv_freq = rope_inv_freq(a)

    def forward(self, tokens):
        _, t = tokens.shape
        x = self.model.embed_tokens(tokens)
        cos, sin = rope_cos_sin(self.inv_freq, t, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.a.tied else self.lm_head.weight
        return x @ w.t()


def init_(model, seed):
    """normal(0, 0.02) for matrices, 1 + normal(0, 0.1) for norm weights,
    normal(0, 0.02) for biases, drawn in named_parameters() order."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def loss_fn(logits, targets):
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE
    )


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer: tensors is a list of (name, torch.Tensor)."""
    dtypes = {torch.float32: "F32", torch.int32: "I32"}
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        arr = t.detach().contiguous().numpy()
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


def write_llmc_tokens(path, tokens):
    """llm.c token file: 256 int32 header (magic, version 1, count), uint16 tokens."""
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
    os.replace(tmp, path)


def eval_windows(stream, seq_len, windows):
    """fdtrain eval's windows (lib/engine/evaluate.h): window i is tokens
    [i (T+1), (i+1) (T+1)); inputs its first T, targets its last T."""
    w = seq_len + 1
    x = torch.tensor(stream[: windows * w], dtype=torch.int64).view(windows, w)
    return x[:, :seq_len].contiguous(), x[:, 1:].contiguous()


def rel(a, b):
    """||a - b|| / ||b||, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def run_case(name, cfg, seed, out_dir):
    a = Arch(cfg)
    model = ForCausalLM(a)
    init_(model, seed)
    params = list(model.named_parameters())
    model64 = copy.deepcopy(model).double()  # before anything runs

    gen = torch.Generator().manual_seed(seed + 1)
    stream = torch.randint(0, a.vocab, (BATCH, SEQ + 1), generator=gen)
    tokens = stream[:, :SEQ].contiguous()
    targets = stream[:, 1:].clone()
    targets[0, 3] = IGNORE
    targets[1, 0] = IGNORE
    targets[2, SEQ - 1] = IGNORE
    n_eval = EVAL_WINDOWS * (EVAL_SEQ_LEN + 1) + EVAL_EXTRA
    eval_stream = torch.randint(0, a.vocab, (n_eval,), generator=gen).tolist()
    ein, eout = eval_windows(eval_stream, EVAL_SEQ_LEN, EVAL_WINDOWS)

    logits = model(tokens)
    loss = loss_fn(logits, targets)
    loss.backward()
    with torch.no_grad():
        eval_loss = loss_fn(model(ein), eout)

    logits64 = model64(tokens)
    loss64 = loss_fn(logits64, targets)
    loss64.backward()
    with torch.no_grad():
        eval_loss64 = loss_fn(model64(ein), eout)
    grads64 = dict((n, p.grad) for n, p in model64.named_parameters())

    # Writes.
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(
        os.path.join(out_dir, "model.safetensors"),
        [(n, p.detach().clone()) for n, p in params],
        {"format": "pt"},
    )
    golden = [
        ("tokens", tokens.to(torch.int32)),
        ("targets", targets.to(torch.int32)),
        ("loss", loss.detach().reshape(1).clone()),
        ("logits", logits.detach().clone()),
    ]
    golden += [("grad." + n, p.grad.detach().clone()) for n, p in params]
    golden += [
        ("rope_inv_freq", model.inv_freq.clone()),
        ("eval_loss", eval_loss.reshape(1).clone()),
        ("eval_windows", torch.tensor([EVAL_WINDOWS], dtype=torch.int32)),
        ("eval_seq_len", torch.tensor([EVAL_SEQ_LEN], dtype=torch.int32)),
    ]
    metadata = {
        "format": "pt",
        "case": name,
        "B": json.dumps(BATCH),
        "T": json.dumps(SEQ),
        "ignore_index": json.dumps(IGNORE),
        "eval_seq_len": json.dumps(EVAL_SEQ_LEN),
        "eval_windows": json.dumps(EVAL_WINDOWS),
        "eval_data": "eval.bin",
        "loss_fp64": repr(loss64.item()),
        "eval_loss_fp64": repr(eval_loss64.item()),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
    }
    write_safetensors(os.path.join(out_dir, "golden.safetensors"), golden, metadata)
    write_llmc_tokens(os.path.join(out_dir, "eval.bin"), eval_stream)

    worst = max(((rel(p.grad, grads64[n]), n) for n, p in params))
    return {
        "loss": loss.item(),
        "loss64": loss64.item(),
        "loss_rel": abs(loss.item() - loss64.item()) / abs(loss64.item()),
        "logits_rel": rel(logits.detach(), logits64.detach()),
        "grad_rel_worst": worst,
        "eval_loss": eval_loss.item(),
        "eval_loss64": eval_loss64.item(),
        "eval_rel": abs(eval_loss.item() - eval_loss64.item()) / abs(eval_loss64.item()),
        "n_params": len(params),
        "n_eval_tokens": n_eval,
    }


def check_llama3_rope():
    """rope_inv_freq (HF's float32 code path) against the formula written out."""
    a = Arch(CASES["llama3"])
    got = rope_inv_freq(a).tolist()
    want = llama3_inv_freq_direct(a.head_dim, a.theta, a.rope_scaling)
    unscaled = [a.theta ** (-i / a.head_dim) for i in range(0, a.head_dim, 2)]
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-6 * abs(w), f"llama3 inv_freq {got} != {want}"
    changed = sum(abs(w - u) > 1e-3 * u for w, u in zip(want, unscaled))
    assert changed > 0, "llama3 scaling changes no frequency at these sizes"
    print(f"llama3 rope self-check ok: inv_freq {['%.6g' % g for g in got]}, "
          f"{changed} of {len(got)} changed by the scaling")


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    check_llama3_rope()
    here = os.path.dirname(os.path.abspath(__file__))
    for i, (name, cfg) in enumerate(CASES.items()):
        r = run_case(name, cfg, 1000 * (i + 1), os.path.join(here, "llama", name))
        print(
            f"{name}: {r['n_params']} params, loss fp32 {r['loss']:.8f} fp64 {r['loss64']:.10f} "
            f"rel {r['loss_rel']:.2e}; logits rel {r['logits_rel']:.2e}; worst grad rel "
            f"{r['grad_rel_worst'][0]:.2e} ({r['grad_rel_worst'][1]}); eval_loss fp32 "
            f"{r['eval_loss']:.8f} fp64 {r['eval_loss64']:.10f} rel {r['eval_rel']:.2e}"
        )


if __name__ == "__main__":
    main()
