#include "lib/ops/elementwise.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kN = 3 * 7 * 12;

Vec reference(const std::vector<Vec>& in) {
  Vec out(in[0].size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = in[0][i] + in[1][i];
  return out;
}

void check(DType dt) {
  std::printf("add %s\n", name_of(dt));
  std::mt19937 rng(9);
  std::vector<Vec> in = {rounded(randn(kN, rng), dt), rounded(randn(kN, rng), dt)};
  const Vec R = rounded(randn(kN, rng), dt);
  Variable a(make_tensor(in[0], Shape{3, 7, 12}, dt), true);
  Variable b(make_tensor(in[1], Shape{3, 7, 12}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = add(a, b);
  EXPECT_EQ(y.dtype(), dt);
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), reference(in), tol);
  backward_with(tape, y, R);
  expect_close("grad a", values(a.grad()), fd_grad(reference, in, 0, R), tol);
  expect_close("grad b", values(b.grad()), fd_grad(reference, in, 1, R), tol);
}

TEST(Add, GradF32) { check(DType::kF32); }
TEST(Add, GradBF16) { check(DType::kBF16); }
TEST(Add, GradF16) { check(DType::kF16); }

// x + x: both contributions land in the one gradient.
TEST(Add, SameInputTwiceGetsBothGradients) {
  Variable x(Tensor::from_vector({1, 2, 3}, Shape{3}), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = add(x, x);
  backward_with(tape, y, {1.0, -2.0, 0.5});
  std::printf("add x + x\n");
  expect_close("grad x", values(x.grad()), {2.0, -4.0, 1.0}, 0.0);
}

void check_scale(DType dt, float factor) {
  std::printf("scale %s by %g\n", name_of(dt), factor);
  RefFn ref = [factor](const std::vector<Vec>& in) {
    Vec out(in[0].size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = in[0][i] * double(factor);
    return out;
  };
  std::mt19937 rng(13);
  std::vector<Vec> in = {rounded(randn(kN, rng), dt)};
  const Vec R = rounded(randn(kN, rng), dt);
  Variable x(make_tensor(in[0], Shape{3, 7, 12}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = scale(x, factor);
  EXPECT_EQ(y.dtype(), dt);
  EXPECT_EQ(y.shape(), x.shape());
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), ref(in), tol);
  backward_with(tape, y, R);
  expect_close("grad x", values(x.grad()), fd_grad(ref, in, 0, R), tol);
}

TEST(Scale, GradF32) { check_scale(DType::kF32, 2.0f); }
TEST(Scale, GradF32Fraction) { check_scale(DType::kF32, 0.3125f); }
TEST(Scale, GradBF16) { check_scale(DType::kBF16, -1.5f); }
TEST(Scale, GradF16) { check_scale(DType::kF16, 4.0f); }

// The gradient accumulates: scale(x, a) + scale(x, b) gives x the gradient a + b.
TEST(Scale, GradientsAccumulate) {
  Variable x(Tensor::from_vector({1, 2, 3}, Shape{3}), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = add(scale(x, 2.0f), scale(x, 0.5f));
  backward_with(tape, y, {1.0, -2.0, 4.0});
  std::printf("scale accumulate\n");
  expect_close("out", values(y.value()), {2.5, 5.0, 7.5}, 0.0);
  expect_close("grad x", values(x.grad()), {2.5, -5.0, 10.0}, 0.0);
}

}  // namespace
}  // namespace fd::ops
