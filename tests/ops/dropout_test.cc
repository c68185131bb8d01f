// dropout: gradients against float64 finite differences with the same
// counter-based mask, bitwise determinism (recompute and resume draw the same
// mask), independence of streams, p = 0 as the identity, and the fraction
// dropped close to p.
#include "lib/ops/dropout.h"

#include <cstring>

#include "lib/base/rng.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kN = 3 * 7 * 12;
constexpr uint64_t kSeed = 1234, kStream = 42;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void check(DType dt, float p) {
  std::printf("dropout %s p=%.2f\n", name_of(dt), p);
  const std::vector<float> mask = dropout_mask(kN, p, kSeed, kStream);
  RefFn reference = [&](const std::vector<Vec>& in) {
    Vec out(in[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = in[0][i] * double(mask[i]);
    return out;
  };
  std::mt19937 rng(3);
  std::vector<Vec> in = {rounded(randn(kN, rng), dt)};
  const Vec R = rounded(randn(kN, rng), dt);
  Variable x(make_tensor(in[0], Shape{3, 7, 12}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = dropout(x, p, kSeed, kStream);
  EXPECT_EQ(y.dtype(), dt);
  EXPECT_EQ(y.shape(), x.shape());
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), reference(in), tol);
  backward_with(tape, y, R);
  expect_close("grad x", values(x.grad()), fd_grad(reference, in, 0, R), tol);
}

TEST(Dropout, GradF32) { check(DType::kF32, 0.1f); }
TEST(Dropout, GradF32HighP) { check(DType::kF32, 0.7f); }
TEST(Dropout, GradBF16) { check(DType::kBF16, 0.1f); }
TEST(Dropout, GradF16) { check(DType::kF16, 0.3f); }

// The mask is a function of (seed, stream, index) only: a second call (a
// recompute under activation checkpointing, or a resumed run) is bitwise
// equal; another stream or seed draws a different mask.
TEST(Dropout, MaskIsCounterBasedAndDeterministic) {
  std::mt19937 rng(11);
  Variable x(make_tensor(randn(4096, rng), Shape{64, 64}, DType::kF32), false);
  Tensor a = dropout(x, 0.25f, kSeed, kStream).value();
  Tensor b = dropout(x, 0.25f, kSeed, kStream).value();
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_FALSE(same_bytes(a, dropout(x, 0.25f, kSeed, kStream + 1).value()));
  EXPECT_FALSE(same_bytes(a, dropout(x, 0.25f, kSeed + 1, kStream).value()));
  // Element i's fate does not depend on the tensor's size or shape.
  Variable head(make_tensor(values(x.value()), Shape{4096}, DType::kF32), false);
  std::vector<float> va = a.to_vector(),
                     vh = dropout(head, 0.25f, kSeed, kStream).value().to_vector();
  EXPECT_EQ(va, vh);
  std::vector<float> m100 = dropout_mask(100, 0.25f, kSeed, kStream);
  std::vector<float> m4096 = dropout_mask(4096, 0.25f, kSeed, kStream);
  EXPECT_TRUE(std::equal(m100.begin(), m100.end(), m4096.begin()));
  // The documented function: keep iff uniform01(hash_words(seed, stream, i)) >= p.
  for (int64_t i = 0; i < 4096; ++i) {
    const bool keep = uniform01(hash_words(kSeed, kStream, uint64_t(i))) >= 0.25f;
    ASSERT_EQ(m4096[size_t(i)], keep ? 1.0f / 0.75f : 0.0f) << i;
  }
}

// The backward regenerates the forward's mask: zero gradient exactly where
// the output is zero, 1 / (1 - p) elsewhere.
TEST(Dropout, BackwardUsesTheForwardMask) {
  const int64_t n = 1000;
  const float p = 0.5f;
  Variable x(Tensor::from_vector(std::vector<float>(n, 1.0f), Shape{n}), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = dropout(x, p, 9, 10);
  backward_with(tape, y, Vec(n, 1.0));
  std::vector<float> out = y.value().to_vector(), g = x.grad().to_vector();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(out[size_t(i)] == 0.0f || out[size_t(i)] == 2.0f) << i;
    EXPECT_EQ(g[size_t(i)], out[size_t(i)]) << i;
  }
}

TEST(Dropout, ZeroIsTheIdentityAndRecordsNothing) {
  Variable x(Tensor::from_vector({1, -2, 3}, Shape{3}), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = dropout(x, 0.0f, kSeed, kStream);
  EXPECT_EQ(tape.size(), 0u);
  EXPECT_EQ(y.slot(), x.slot());  // the very same variable
  EXPECT_TRUE(same_bytes(y.value(), x.value()));
}

// The fraction dropped is p within 5 standard deviations of a binomial, and
// the mean is preserved (inverted dropout).
TEST(Dropout, FractionDroppedIsP) {
  const int64_t n = 1 << 20;
  for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    std::vector<float> m = dropout_mask(n, p, kSeed, uint64_t(p * 1000));
    int64_t dropped = 0;
    double sum = 0;
    for (float v : m) {
      dropped += v == 0.0f;
      sum += v;
    }
    const double frac = double(dropped) / double(n);
    const double sd = std::sqrt(double(p) * (1 - p) / double(n));
    std::printf("  p %.2f: dropped %.5f (sd %.1e), mean multiplier %.5f\n", p, frac, sd,
                sum / double(n));
    EXPECT_NEAR(frac, p, 5 * sd);
    EXPECT_NEAR(sum / double(n), 1.0, 5 * sd / (1 - p));
  }
}

TEST(Dropout, RejectsPOutsideZeroOne) {
  Variable x(Tensor::from_vector({1, 2}, Shape{2}), false);
  EXPECT_DEATH(dropout(x, 1.0f, 1, 2), "p must be in");
  EXPECT_DEATH(dropout(x, -0.1f, 1, 2), "p must be in");
}

}  // namespace
}  // namespace fd::ops
