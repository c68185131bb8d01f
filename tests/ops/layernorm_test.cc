#include "lib/ops/layernorm.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kRows = 3 * 7, kC = 12;
constexpr double kEps = 1e-5;

// Inputs {x, weight, bias?}; biased variance, like torch.nn.LayerNorm.
Vec reference(const std::vector<Vec>& in) {
  Vec out(kRows * kC);
  for (int64_t r = 0; r < kRows; ++r) {
    const double* x = in[0].data() + r * kC;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < kC; ++i) mean += x[i] / kC;
    for (int64_t i = 0; i < kC; ++i) var += (x[i] - mean) * (x[i] - mean) / kC;
    for (int64_t i = 0; i < kC; ++i)
      out[r * kC + i] =
          (x[i] - mean) / std::sqrt(var + kEps) * in[1][i] + (in.size() > 2 ? in[2][i] : 0.0);
  }
  return out;
}

// x in dtype dt; weight and bias in wdt.
void check(DType dt, bool has_bias, DType wdt) {
  std::printf("layernorm x:%s weight:%s bias=%d\n", name_of(dt), name_of(wdt), has_bias);
  std::mt19937 rng(3);
  Vec x = randn(kRows * kC, rng, 2.0);
  for (double& v : x) v += 1.5;  // a non-zero mean to remove
  Vec w = randn(kC, rng, 0.5);
  for (double& v : w) v += 1.0;
  std::vector<Vec> in = {rounded(x, dt), rounded(w, wdt), rounded(randn(kC, rng), wdt)};
  if (!has_bias) in.pop_back();
  const Vec R = rounded(randn(kRows * kC, rng), dt);
  Variable xv(make_tensor(in[0], Shape{3, 7, kC}, dt), true);
  Variable wv(make_tensor(in[1], Shape{kC}, wdt), true);
  Variable bv = has_bias ? Variable(make_tensor(in[2], Shape{kC}, wdt), true) : Variable();
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = layernorm(xv, wv, bv, float(kEps));
  EXPECT_EQ(y.dtype(), dt);
  const double tol = std::max(tol_for(dt), tol_for(wdt));
  expect_close("out", values(y.value()), reference(in), tol);
  backward_with(tape, y, R);
  expect_close("grad x", values(xv.grad()), fd_grad(reference, in, 0, R), tol);
  expect_close("grad weight", values(wv.grad()), fd_grad(reference, in, 1, R), tol);
  if (has_bias) expect_close("grad bias", values(bv.grad()), fd_grad(reference, in, 2, R), tol);
}

TEST(Layernorm, GradF32) { check(DType::kF32, true, DType::kF32); }
TEST(Layernorm, GradNoBiasF32) { check(DType::kF32, false, DType::kF32); }
TEST(Layernorm, GradBF16) { check(DType::kBF16, true, DType::kBF16); }
TEST(Layernorm, GradF16) { check(DType::kF16, true, DType::kF16); }
TEST(Layernorm, GradBF16ActivationsF32Weights) { check(DType::kBF16, true, DType::kF32); }

}  // namespace
}  // namespace fd::ops
