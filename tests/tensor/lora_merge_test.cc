// merge_lora_into against its specification written out: per element,
// double(W) + scaling * (sum over q in order of B[o][q] * A[q][i] in float64),
// rounded once to fp32; the Conv1D layout is the transpose of the Linear one.
#include "lib/tensor/lora_merge.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace fd {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(LoraMerge, IsTheFloat64SumRoundedOnceInBothLayouts) {
  const int64_t r = 3, in = 37, out = 21;
  const double scaling = 16.0 / 3.0;
  std::mt19937 rng(7);
  const std::vector<float> w = randn(size_t(out * in), rng, 0.02f);  // [out, in]
  const std::vector<float> a = randn(size_t(r * in), rng, 0.3f),
                           b = randn(size_t(out * r), rng, 0.3f);
  std::vector<float> w_t(w.size());  // the same weight as Conv1D (in, out)
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) w_t[size_t(i * out + o)] = w[size_t(o * in + i)];

  std::vector<float> linear = w, conv1d = w_t;
  merge_lora_into(linear, a, b, r, in, out, scaling, WeightLayout::kOutIn);
  merge_lora_into(conv1d, a, b, r, in, out, scaling, WeightLayout::kInOut);
  int differs_from_fp32 = 0;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double d = 0.0;
      float d32 = 0.0f;
      for (int64_t q = 0; q < r; ++q) {
        d += double(b[size_t(o * r + q)]) * double(a[size_t(q * in + i)]);
        d32 += b[size_t(o * r + q)] * a[size_t(q * in + i)];
      }
      // volatile: g++ would otherwise fuse the product and the sum into one FMA here, which
      // merge_lora_into (compiled -ffp-contract=off) does not do.
      const volatile double scaled = scaling * d;
      const float want = float(double(w[size_t(o * in + i)]) + scaled);
      ASSERT_EQ(linear[size_t(o * in + i)], want) << o << ", " << i;
      ASSERT_EQ(conv1d[size_t(i * out + o)], want) << o << ", " << i;
      differs_from_fp32 += want != w[size_t(o * in + i)] + float(scaling) * d32;
    }
  // The precision is visible: an fp32 merge gives other bits for some elements.
  std::printf("  %d of %lld elements differ from an fp32 merge\n", differs_from_fp32,
              static_cast<long long>(out * in));
  EXPECT_GT(differs_from_fp32, 0);
}

TEST(LoraMerge, ZeroBLeavesTheWeightUnchanged) {
  std::mt19937 rng(3);
  const std::vector<float> w = randn(12, rng, 1.0f), a = randn(8, rng, 1.0f);
  std::vector<float> m = w;
  merge_lora_into(m, a, std::vector<float>(6, 0.0f), 2, 4, 3, 8.0, WeightLayout::kInOut);
  EXPECT_EQ(m, w);
}

}  // namespace
}  // namespace fd
