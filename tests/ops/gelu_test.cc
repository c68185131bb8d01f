#include "lib/ops/gelu.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kN = 3 * 7 * 12;

Vec reference(const std::vector<Vec>& in) {
  Vec out(in[0].size());
  const double s = std::sqrt(2.0 / M_PI);
  for (size_t i = 0; i < out.size(); ++i) {
    const double x = in[0][i];
    out[i] = 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
  }
  return out;
}

void check(DType dt) {
  std::printf("gelu %s\n", name_of(dt));
  std::mt19937 rng(5);
  Vec x = randn(kN, rng, 2.5);
  x[0] = 12.0;  // saturated tails
  x[1] = -12.0;
  x[2] = 0.0;
  std::vector<Vec> in = {rounded(x, dt)};
  const Vec R = rounded(randn(kN, rng), dt);
  Variable xv(make_tensor(in[0], Shape{3, 7, 12}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = gelu(xv);
  EXPECT_EQ(y.dtype(), dt);
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), reference(in), tol);
  backward_with(tape, y, R);
  expect_close("grad x", values(xv.grad()), fd_grad(reference, in, 0, R), tol);
}

TEST(Gelu, GradF32) { check(DType::kF32); }
TEST(Gelu, GradBF16) { check(DType::kBF16); }
TEST(Gelu, GradF16) { check(DType::kF16); }

// The vectorised tanh must stay accurate across the whole range, not just on random inputs.
TEST(Gelu, DenseSweepMatchesReference) {
  Vec x;
  for (double v = -10.0; v <= 10.0; v += 1.0 / 64) x.push_back(v);
  x = rounded(x, DType::kF32);
  Variable xv(make_tensor(x, Shape{int64_t(x.size())}, DType::kF32), false);
  std::printf("gelu sweep [-10, 10]\n");
  expect_close("out", values(gelu(xv).value()), reference({x}), 1e-6);
}

}  // namespace
}  // namespace fd::ops
