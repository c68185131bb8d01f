// rope: rotary position embeddings on per-head query or key vectors, with
// Hugging Face's rotate_half pairing (element i with element i + D/2), and
// the cos/sin tables Hugging Face's Llama builds for them.
//
// The tables are plain fp32 tensors, built once per model: cos and sin of
// position p times inv_freq, duplicated over both halves of the head
// (emb = cat(freqs, freqs)). rope() computes in fp32; backward applies the
// transposed rotation.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// How inv_freq = 1 / theta^(2j / D) is rescaled (Hugging Face rope_scaling.rope_type).
enum class RopeScalingKind {
  kDefault,  // unchanged
  kLinear,   // inv_freq / factor
  kLlama3,   // Llama 3.1: long wavelengths / factor, short ones kept, a smooth ramp between
};

struct RopeOptions {
  int64_t head_dim = 64;   // D, even
  double theta = 10000.0;  // rope_theta
  RopeScalingKind kind = RopeScalingKind::kDefault;
  double factor = 1.0;                              // linear and llama3: the scaling factor
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// The rotation tables for positions [0, max_positions): fp32 (max_positions, head_dim)
// tensors on the default device (category kParams), as LlamaRotaryEmbedding's cos and sin
// (attention scaling 1 for these kinds): inv_freq as rope_inv_freq, the angle
// position * inv_freq an fp32 product as torch's, then its cos and sin correctly rounded.
// At every position up to 131071 this is Hugging Face's table to within one ulp
// (tests/golden/rope_golden_test.cc); the angles themselves are the same bits.
struct RopeTables {
  Tensor cos, sin;
};
RopeTables rope_tables(const RopeOptions& o, int64_t max_positions);

// The fp32 inverse frequencies (D/2 of them) that rope_tables uses, computed with the
// float32 operations of transformers' modeling_rope_utils, each rounded as torch rounds it on
// the CPU: the same bits as transformers (its scalar kernels; torch's vectorised powf can be
// one ulp off in a frequency or two). Rounding a float64 computation once instead differs in
// about a third of the frequencies, which at position 1e5 moves the angle by up to 8e-3 rad.
std::vector<float> rope_inv_freq(const RopeOptions& o);

// x: (B, T, C) with C = n_heads * D, head h at columns [h*D, (h+1)*D) (the layout of a
// q or k projection's output, as causal_attention splits heads), or (B, T, H, D).
// cos, sin: fp32 (P, D) with P >= T; position t uses row t.
// out[i] = x[i] cos[i] - x[i+D/2] sin[i], out[i+D/2] = x[i+D/2] cos[i+D/2] + x[i] sin[i+D/2]
// for i < D/2 (x * cos + rotate_half(x) * sin). out has x's dtype. CPU, GPU and meta; the
// tables must be on x's device (rope_tables under the same default device). Saves cos and
// sin (not x) for backward.
// positions: empty, or an i32 (B, T) tensor giving each token's position (packed batches
// restart positions at every document): row b, t uses table row positions[b, t] (each in
// [0, P)) instead of t. On the host it is checked and, for a GPU op, copied to the GPU; on
// x's GPU it is used as given (check it on the host first).
Variable rope(const Variable& x, const Tensor& cos, const Tensor& sin,
              const Tensor& positions = {});

}  // namespace fd::ops
