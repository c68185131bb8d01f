#!/usr/bin/python3
"""Hugging Face's RoPE tables at long positions, for tests/golden/rope_golden_test.cc.

inv_freq as transformers' modeling_rope_utils computes it (default, linear and
llama3 rope types), then LlamaRotaryEmbedding.forward's fp32 angles
inv_freq @ position_ids and their cos/sin, all float32 torch code on the CPU,
for real models' RoPE settings at positions up to 131071. Writes
tests/golden/rope/hf_rope.safetensors:

  positions          I32 (P,)       the positions sampled
  <case>.inv_freq    F32 (D/2,)     inv_freq
  <case>.cos         F32 (P, D)     cos(emb), emb = cat(freqs, freqs), at those positions
  <case>.sin         F32 (P, D)     sin(emb)

torch's CPU kernels come in a scalar and vectorised (AVX2, AVX-512: SLEEF)
form, and SLEEF's powf and cosf are not correctly rounded, so inv_freq itself
depends on the CPU torch runs on (1 ulp in one frequency of two of these
cases, see tests/golden/README.md). This script pins the scalar kernels
(ATEN_CPU_CAPABILITY=default, set before torch is imported) so that the file
does not depend on the machine that writes it.

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 tests/golden/make_golden_rope.py
"""

import json
import math
import os
import struct

os.environ["ATEN_CPU_CAPABILITY"] = "default"
import torch  # noqa: E402

POSITIONS = [0, 1, 2047, 4096, 8191, 8192, 16383, 32768, 65535, 100000, 131071]

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# name: (head_dim, rope_theta, rope_scaling); the C++ test lists the same cases.
CASES = {
    "llama31": (128, 500000.0, LLAMA3),  # Llama 3.1 / 3.2
    "llama2": (128, 10000.0, None),
    "qwen": (128, 1000000.0, None),  # Qwen2.5, Qwen3, Mistral v0.2+
    "smollm2": (64, 100000.0, None),
    "linear4": (128, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    "d96": (96, 10000.0, None),  # 2j / D is not exact in float32
}


def inv_freq(dim, base, rs):
    """modeling_rope_utils, float32 as there."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if rs is None:
        return inv
    if rs["rope_type"] == "linear":
        return inv / rs["factor"]
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def cos_sin(inv, positions):
    """LlamaRotaryEmbedding.forward (attention_scaling 1), float32."""
    position_ids = torch.tensor([positions], dtype=torch.int64)
    inv_freq_expanded = inv[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[0], emb.sin()[0]


def write_safetensors(path, tensors, metadata):
    dtypes = {torch.float32: "F32", torch.int32: "I32"}
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors:
        data = t.contiguous().numpy().tobytes()  # little-endian on every machine torch runs on
        header[name] = {
            "dtype": dtypes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    torch.set_num_threads(1)
    tensors = [("positions", torch.tensor(POSITIONS, dtype=torch.int32))]
    meta = {"torch": torch.__version__, "aten_cpu_capability": "default"}
    for name, (dim, base, rs) in CASES.items():
        inv = inv_freq(dim, base, rs)
        c, s = cos_sin(inv, POSITIONS)
        tensors += [(name + ".inv_freq", inv), (name + ".cos", c), (name + ".sin", s)]
        meta[name] = json.dumps({"head_dim": dim, "rope_theta": base, "rope_scaling": rs})
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope", "hf_rope.safetensors")
    write_safetensors(out, tensors, meta)
    print(f"wrote {out}: {len(CASES)} cases, positions {POSITIONS}")


if __name__ == "__main__":
    main()
