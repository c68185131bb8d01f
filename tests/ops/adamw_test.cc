#include "lib/ops/adamw.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

// torch.optim.AdamW's formula, in double, for `steps` steps with gradients grads[step - 1].
void reference(Vec& p, Vec& m, Vec& v, const std::vector<Vec>& grads, const AdamWStep& s) {
  for (size_t t = 1; t <= grads.size(); ++t) {
    const double bc1 = 1 - std::pow(double(s.beta1), double(t));
    const double bc2 = 1 - std::pow(double(s.beta2), double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grads[t - 1][i];
      p[i] *= 1 - double(s.lr) * double(s.weight_decay);
      m[i] = double(s.beta1) * m[i] + (1 - double(s.beta1)) * g;
      v[i] = double(s.beta2) * v[i] + (1 - double(s.beta2)) * g * g;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + double(s.eps);
      p[i] -= double(s.lr) / bc1 * m[i] / denom;
    }
  }
}

TEST(AdamW, ThreeStepsMatchTorchFormula) {
  const int64_t n = 37;  // not a multiple of any vector width
  std::mt19937 rng(29);
  const Vec p0 = rounded(randn(n, rng), DType::kF32);
  std::vector<Vec> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(rounded(randn(n, rng, 0.1), DType::kF32));
  grads[1][5] = 0.0;  // a zero gradient: only weight decay and momentum move it
  AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};

  std::vector<float> p(p0.begin(), p0.end()), m(n, 0.0f), v(n, 0.0f);
  for (int t = 0; t < 3; ++t) {
    s.step = t + 1;
    std::vector<float> g(grads[t].begin(), grads[t].end());
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
  }
  Vec rp = p0, rm(n, 0.0), rv(n, 0.0);
  reference(rp, rm, rv, grads, s);
  std::printf("adamw 3 steps, n=37\n");
  // Compare the change of the parameters, which is what the update computes.
  Vec dp(n), rdp(n);
  for (int64_t i = 0; i < n; ++i) {
    dp[i] = double(p[i]) - p0[i];
    rdp[i] = rp[i] - p0[i];
  }
  expect_close("param - param0", dp, rdp, 1e-5);
  expect_close("m", Vec(m.begin(), m.end()), rm, 1e-6);
  expect_close("v", Vec(v.begin(), v.end()), rv, 1e-6);
}

// With bias correction the first step moves every parameter by about lr (sign of the gradient).
TEST(AdamW, FirstStepIsLrTimesSignWithoutDecay) {
  std::vector<float> p = {1.0f, 1.0f}, g = {0.5f, -3.0f}, m = {0, 0}, v = {0, 0};
  adamw_update(p.data(), g.data(), m.data(), v.data(), 2, {0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1});
  EXPECT_NEAR(p[0], 0.9f, 1e-6f);
  EXPECT_NEAR(p[1], 1.1f, 1e-6f);
}

// The reference rounds every fp32 operation on its own, in the documented order (adamw.h): here
// each intermediate goes through a volatile, so that this file's own -ffp-contract=fast cannot
// fuse it either. Fails if adamw.cc loses its -ffp-contract=off (CMakeLists.txt) in a build with
// FMA (-march=native on a CPU that has it).
TEST(AdamW, ReferenceRoundsEveryOperation) {
  const int64_t n = 100000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    g[i] = normal(rng) * 1e-2f;
    m[i] = normal(rng) * 1e-2f;
    v[i] = normal(rng) * normal(rng) * 1e-4f;
  }
  const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5};
  std::vector<float> rp = p, rm = m, rv = v;
  adamw_update(rp.data(), g.data(), rm.data(), rv.data(), n, s);

  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const float decay = float(1.0 - double(s.lr) * double(s.weight_decay));
  const float step_size = float(double(s.lr) / bc1), bc2_sqrt = float(std::sqrt(bc2));
  const float omb1 = 1.0f - s.beta1, omb2 = 1.0f - s.beta2;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    volatile float d = g[i] - m[i], e = omb1 * d, mi = m[i] + e;
    volatile float a = s.beta2 * v[i], b = omb2 * g[i], c = b * g[i], vi = a + c;
    volatile float r = std::sqrt(vi), q = r / bc2_sqrt, denom = q + s.eps;
    volatile float u = mi / denom, w = step_size * u, x = p[i] * decay, pi = x - w;
    differ += f32_bits(pi) != f32_bits(rp[i]) || f32_bits(mi) != f32_bits(rm[i]) ||
              f32_bits(vi) != f32_bits(rv[i]);
  }
  std::printf("adamw reference vs one rounding per operation: %lld of %lld elements differ\n",
              static_cast<long long>(differ), static_cast<long long>(n));
  EXPECT_EQ(differ, 0);
}

}  // namespace
}  // namespace fd::ops
