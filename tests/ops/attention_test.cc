#include "lib/ops/attention.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int kHeads = 3;
constexpr int64_t kC = 12, kHs = kC / kHeads;

// Inputs {qkv (B, T, 3C)}; the naive T x T softmax(q k^T / sqrt(hs) + mask) v per head.
RefFn reference(int64_t B, int64_t T, int64_t C, int n_head) {
  return [=](const std::vector<Vec>& in) {
    const Vec& x = in[0];
    const int64_t hs = C / n_head;
    Vec out(B * T * C);
    Vec p(T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < n_head; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const double* q = &x[(b * T + i) * 3 * C + h * hs];
          double m = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            const double* k = &x[(b * T + j) * 3 * C + C + h * hs];
            double s = 0;
            for (int64_t d = 0; d < hs; ++d) s += q[d] * k[d];
            p[j] = s / std::sqrt(double(hs));
            m = std::max(m, p[j]);
          }
          double z = 0;
          for (int64_t j = 0; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
          for (int64_t d = 0; d < hs; ++d) {
            double o = 0;
            for (int64_t j = 0; j <= i; ++j)
              o += p[j] / z * x[(b * T + j) * 3 * C + 2 * C + h * hs + d];
            out[(b * T + i) * C + h * hs + d] = o;
          }
        }
    return out;
  };
}

void check(int64_t B, int64_t T, DType dt) {
  std::printf("causal_attention B=%ld T=%ld C=%ld n_head=%d %s\n", long(B), long(T), long(kC),
              kHeads, name_of(dt));
  std::mt19937 rng(13);
  std::vector<Vec> in = {rounded(randn(B * T * 3 * kC, rng, 1.5), dt)};
  const Vec R = rounded(randn(B * T * kC, rng), dt);
  Variable qkv(make_tensor(in[0], Shape{B, T, 3 * kC}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = causal_attention(qkv, kHeads);
  EXPECT_EQ(y.shape(), (Shape{B, T, kC}));
  EXPECT_EQ(y.dtype(), dt);
  const RefFn ref = reference(B, T, kC, kHeads);
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), ref(in), tol);
  backward_with(tape, y, R);
  expect_close("grad qkv", values(qkv.grad()), fd_grad(ref, in, 0, R), tol);
}

TEST(CausalAttention, GradF32) { check(3, 7, DType::kF32); }
TEST(CausalAttention, GradSingleTokenF32) { check(3, 1, DType::kF32); }
TEST(CausalAttention, GradBF16) { check(3, 7, DType::kBF16); }
TEST(CausalAttention, GradF16) { check(2, 7, DType::kF16); }

// T = 150 spans two query blocks of the implementation. A full finite-difference gradient is
// too slow here, so the gradient is checked along random directions U:
// <grad, U> against (L(x + hU) - L(x - hU)) / 2h.
TEST(CausalAttention, MultiBlockDirectionalDerivativeF32) {
  const int64_t B = 1, T = 150, C = 8;
  const int n_head = 2;
  std::printf("causal_attention B=1 T=150 C=8 n_head=2 f32 (directional)\n");
  std::mt19937 rng(17);
  const Vec x = rounded(randn(B * T * 3 * C, rng), DType::kF32);
  const Vec R = rounded(randn(B * T * C, rng), DType::kF32);
  Variable qkv(make_tensor(x, Shape{B, T, 3 * C}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = causal_attention(qkv, n_head);
  const RefFn ref = reference(B, T, C, n_head);
  expect_close("out", values(y.value()), ref({x}), 1e-5);
  backward_with(tape, y, R);
  const Vec g = values(qkv.grad());
  Vec got, want;
  for (int dir = 0; dir < 4; ++dir) {
    const Vec u = randn(int64_t(x.size()), rng);
    auto loss = [&](double h) {
      Vec xp = x;
      for (size_t i = 0; i < xp.size(); ++i) xp[i] += h * u[i];
      Vec out = ref({xp});
      double s = 0;
      for (size_t i = 0; i < out.size(); ++i) s += R[i] * out[i];
      return s;
    };
    const double h = 1e-6;
    want.push_back((loss(h) - loss(-h)) / (2 * h));
    double dot = 0;
    for (size_t i = 0; i < g.size(); ++i) dot += g[i] * u[i];
    got.push_back(dot);
  }
  expect_close("<grad qkv, U> (4 directions)", got, want, 1e-4);
}

// Changing token 4's q, k and v must leave the outputs of tokens 0..3 bit-identical.
TEST(CausalAttention, FutureTokensDoNotInfluenceThePast) {
  const int64_t B = 2, T = 7, perturbed = 4;
  std::mt19937 rng(19);
  Vec x = randn(B * T * 3 * kC, rng);
  Variable before(make_tensor(x, Shape{B, T, 3 * kC}, DType::kF32), false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < 3 * kC; ++c) x[(b * T + perturbed) * 3 * kC + c] += 3.0;
  Variable after(make_tensor(x, Shape{B, T, 3 * kC}, DType::kF32), false);
  const std::vector<float> y0 = causal_attention(before, kHeads).value().to_vector();
  const std::vector<float> y1 = causal_attention(after, kHeads).value().to_vector();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      bool same = true;
      for (int64_t c = 0; c < kC; ++c)
        same = same && y0[(b * T + t) * kC + c] == y1[(b * T + t) * kC + c];
      EXPECT_EQ(same, t < perturbed) << "batch " << b << " token " << t;
    }
}

}  // namespace
}  // namespace fd::ops
