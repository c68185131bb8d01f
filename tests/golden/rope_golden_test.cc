// RoPE at long positions against Hugging Face's fp32 recipe (golden data from
// tests/golden/make_golden_rope.py: transformers' inv_freq and
// LlamaRotaryEmbedding's cos/sin, torch on the CPU, for the RoPE settings of
// Llama 3.1, Llama 2, Qwen2.5/Qwen3/Mistral, SmolLM2, linear scaling and a
// head_dim of 96, at positions up to 131071).
//
// The angle is p * inv_freq in fp32, so one ulp of inv_freq moves it by
// p * ulp: up to 8e-3 rad at position 1e5 when inv_freq is rounded once from
// float64 instead of computed as torch does. Pinned here: inv_freq equals
// torch's bit for bit, and every cos and sin at the sampled positions is
// within one ulp of torch's (the angles are the same fp32 products; cos and
// sin of them are correctly rounded here, torch's within its libm's error).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "lib/ops/rope.h"
#include "lib/tensor/safetensors.h"

namespace fd {
namespace {

using ops::RopeOptions;
using ops::RopeScalingKind;

const SafetensorsFile& golden() {
  static const SafetensorsFile f =
      SafetensorsFile::open(std::string(FD_SOURCE_DIR) + "/tests/golden/rope/hf_rope.safetensors");
  return f;
}

// The distance from |x| to the next float up: one ulp of x.
double ulp(float x) {
  const float a = std::fabs(x);
  return double(std::nextafter(a, std::numeric_limits<float>::infinity())) - double(a);
}

void check(const std::string& name, const RopeOptions& o) {
  const SafetensorsFile& g = golden();
  const std::vector<float> want_inv = g.load(name + ".inv_freq").to_vector();
  const std::vector<float> inv = ops::rope_inv_freq(o);
  ASSERT_EQ(inv.size(), want_inv.size());
  int inv_differ = 0;
  for (size_t j = 0; j < inv.size(); ++j) {
    inv_differ += std::memcmp(&inv[j], &want_inv[j], sizeof(float)) != 0;
    EXPECT_EQ(inv[j], want_inv[j]) << name << " inv_freq[" << j << "]";
  }
  const Tensor positions = g.load("positions");
  const std::vector<float> want_cos = g.load(name + ".cos").to_vector();
  const std::vector<float> want_sin = g.load(name + ".sin").to_vector();
  const int64_t n = positions.shape()[0], D = o.head_dim;
  const int32_t* pos = positions.i32();
  const ops::RopeTables t = ops::rope_tables(o, int64_t(pos[n - 1]) + 1);
  const std::vector<float> cos = t.cos.to_vector(), sin = t.sin.to_vector();
  double worst = 0, worst_ulps = 0;
  int64_t same = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < D; ++d)
      for (const auto& [ours, ref] : {std::pair{&cos, &want_cos}, std::pair{&sin, &want_sin}}) {
        const float a = (*ours)[size_t(int64_t(pos[i]) * D + d)], b = (*ref)[size_t(i * D + d)];
        const double diff = std::fabs(double(a) - double(b));
        worst = std::max(worst, diff);
        worst_ulps = std::max(worst_ulps, diff / ulp(std::fabs(a) > std::fabs(b) ? a : b));
        same += a == b;
        EXPECT_LE(diff, ulp(std::fabs(a) > std::fabs(b) ? a : b))
            << name << " position " << pos[i] << " column " << d << ": " << a << " vs " << b;
      }
  std::printf(
      "%-8s inv_freq: %d of %zu differ; cos/sin at %lld positions up to %d: max |diff| "
      "%.3e (%.2f ulp), %.2f%% identical\n",
      name.c_str(), inv_differ, inv.size(), static_cast<long long>(n), pos[n - 1], worst,
      worst_ulps, 100.0 * double(same) / double(2 * n * D));
}

const RopeOptions kLlama3{.head_dim = 128,
                          .theta = 500000.0,
                          .kind = RopeScalingKind::kLlama3,
                          .factor = 8.0,
                          .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0,
                          .original_max_position_embeddings = 8192};

TEST(RopeGolden, Llama31) { check("llama31", kLlama3); }
TEST(RopeGolden, Llama2) { check("llama2", {.head_dim = 128, .theta = 10000.0}); }
TEST(RopeGolden, QwenAndMistral) { check("qwen", {.head_dim = 128, .theta = 1e6}); }
TEST(RopeGolden, SmolLM2) { check("smollm2", {.head_dim = 64, .theta = 100000.0}); }
TEST(RopeGolden, Linear) {
  check("linear4",
        {.head_dim = 128, .theta = 10000.0, .kind = RopeScalingKind::kLinear, .factor = 4.0});
}
TEST(RopeGolden, HeadDim96) { check("d96", {.head_dim = 96, .theta = 10000.0}); }

}  // namespace
}  // namespace fd
