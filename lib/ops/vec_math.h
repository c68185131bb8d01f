// Branch-free exp and tanh that g++ -O3 vectorises, and vectorisable sum and max.
//
// libm's expf/tanhf are scalar calls, which would make softmax, cross-entropy
// and GELU the slowest part of a step. exp_f32 is the Cephes expf polynomial
// (about 1 ulp on [-87, 88]); rounding and the exponent use bit tricks
// instead of floor and ldexp so the loop body has no calls. Internal to lib/ops,
// which is compiled with -fno-trapping-math: without it GCC keeps the clamps'
// float comparisons as branches and no loop over exp_f32 vectorises
// (-fopt-info-vec: "control flow in loop"). max_f32's 16 lanes of selects
// compile to scalar maxss (GCC does not vectorise them); it is one cheap pass.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace fd::ops {

// e^x. Inputs below -88.37 give 0 (true value < 2^-127), above 88.37 give
// about 2.4e38 instead of overflowing; NaN gives NaN.
inline float exp_f32(float x) {
  // std::max(x, lo) then std::min(., hi), written on values (std::max returns a reference,
  // whose conditional load keeps GCC from vectorising loops over exp_f32); NaN stays NaN.
  x = x < -88.3762626647949f ? -88.3762626647949f : x;
  x = 88.3762626647949f < x ? 88.3762626647949f : x;
  // n = round(x / ln2): adding and removing 1.5 * 2^23 rounds to an integer (std::floor
  // would not vectorise without -ffast-math).
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // x - n ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n: adding 1.5 * 2^23 puts the integer n + 127 in the low mantissa bits.
  uint32_t e = std::bit_cast<uint32_t>(n + (12582912.0f + 127.0f)) << 23;
  return p * std::bit_cast<float>(e);
}

// tanh(x) = 1 - 2 / (e^{2x} + 1); absolute error about 1e-7 (what GELU needs).
inline float tanh_f32(float x) {
  x = x < -9.0f ? -9.0f : x;
  x = 9.0f < x ? 9.0f : x;
  return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f);
}

// sum over i in [0, n) of f(i), with 16 independent float accumulators so the loop
// vectorises instead of forming one serial chain of adds.
template <typename F>
inline float sum_over(int64_t n, F f) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) acc[k] += f(i + k);
  float s = 0.0f;
  for (; i < n; ++i) s += f(i);
  for (int k = 0; k < 16; ++k) s += acc[k];
  return s;
}

// max of p[0..n), n >= 1.
inline float max_f32(const float* __restrict p, int64_t n) {
  float acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = p[0];
  int64_t i = 0;
  // std::max(a, b) as (a < b ? b : a) on values: vectorises (see exp_f32).
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; ++k) {
      const float v = p[i + k];
      acc[k] = acc[k] < v ? v : acc[k];
    }
  float m = p[0];
  for (; i < n; ++i) m = m < p[i] ? p[i] : m;
  for (int k = 0; k < 16; ++k) m = m < acc[k] ? acc[k] : m;
  return m;
}

}  // namespace fd::ops
