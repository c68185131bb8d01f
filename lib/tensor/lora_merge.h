// merge_lora_into: a LoRA adapter folded into its base weight, W + scaling * B A.
//
// The one implementation of the merge: the KV-cached decoder (lib/nn), the
// Hugging Face directory export (lib/engine) and the merged safetensors/PEFT
// exports (lib/ckpt) all call it, so a merged model is the same bits whichever
// of them built it. It lives here, on plain fp32 arrays, because lib/tensor is
// the lowest layer all three reach (lib/ckpt does not depend on lib/ops or
// lib/nn).
#pragma once

#include <cstdint>
#include <span>

namespace fd {

// How a linear layer stores its weight.
enum class WeightLayout {
  kOutIn,  // torch nn.Linear (the Llama family): [out, in], y = x W^T
  kInOut,  // GPT-2's Conv1D: (in, out), y = x W
};

// w += scaling * B A (kOutIn), or scaling * (B A)^T (kInOut), where
// a is A (r, in) and b is B (out, r), row-major fp32, as PEFT stores
// lora_A.weight and lora_B.weight. Each element of B A is accumulated in
// float64 over q = 0..r-1 in order (every product of two floats is exact in
// float64), then w's element is computed as double(w) + scaling * delta (two
// roundings in float64, never fused into an FMA) and rounded to fp32. The same
// bits on every machine and build, whatever the threads or BLAS.
// FD_CHECKs the sizes: w in * out, a r * in, b out * r, r >= 1.
void merge_lora_into(std::span<float> w, std::span<const float> a, std::span<const float> b,
                     int64_t r, int64_t in, int64_t out, double scaling, WeightLayout layout);

}  // namespace fd
