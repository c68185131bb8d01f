#include "lib/ops/cross_entropy.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kRows = 3 * 7, kV = 37;

// Inputs {logits}; mean over non-ignored rows of logsumexp - logit[target].
RefFn reference(const std::vector<float>& targets, int ignore) {
  return [targets, ignore](const std::vector<Vec>& in) {
    double total = 0;
    int count = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      if (int(targets[r]) == ignore) continue;
      const double* x = in[0].data() + r * kV;
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j < kV; ++j) m = std::max(m, x[j]);
      for (int64_t j = 0; j < kV; ++j) z += std::exp(x[j] - m);
      total += m + std::log(z) - x[int64_t(targets[r])];
      ++count;
    }
    return Vec{count ? total / count : 0.0};
  };
}

void check(DType dt, int ignore) {
  std::printf("cross_entropy %s ignore_index=%d\n", name_of(dt), ignore);
  std::mt19937 rng(23);
  std::vector<Vec> in = {rounded(randn(kRows * kV, rng, 3.0), dt)};
  std::vector<float> targets;
  for (int64_t r = 0; r < kRows; ++r)
    targets.push_back(r % 4 == 1 ? float(ignore) : float((r * 7) % kV));
  const Vec R = {1.7};  // the loss gradient seed
  Variable logits(make_tensor(in[0], Shape{3, 7, kV}, dt), true);
  Tensor tg = Tensor::from_vector(targets, Shape{3, 7}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable loss = cross_entropy(logits, tg, ignore);
  EXPECT_EQ(loss.shape().numel(), 1);
  EXPECT_EQ(loss.dtype(), DType::kF32);
  const RefFn ref = reference(targets, ignore);
  expect_close("loss", values(loss.value()), ref(in), dt == DType::kF32 ? 1e-6 : 1e-5);
  backward_with(tape, loss, R);
  const Vec g = values(logits.grad());
  expect_close("grad logits", g, fd_grad(ref, in, 0, R), tol_for(dt));
  double ignored_abs = 0;
  for (int64_t r = 0; r < kRows; ++r)
    if (int(targets[r]) == ignore)
      for (int64_t j = 0; j < kV; ++j) ignored_abs += std::abs(g[r * kV + j]);
  EXPECT_EQ(ignored_abs, 0.0) << "ignored rows must get no gradient";
}

TEST(CrossEntropy, GradWithIgnoredTargetsF32) { check(DType::kF32, -1); }
TEST(CrossEntropy, GradCustomIgnoreIndexF32) { check(DType::kF32, 3); }
TEST(CrossEntropy, GradWithIgnoredTargetsBF16) { check(DType::kBF16, -1); }
TEST(CrossEntropy, GradWithIgnoredTargetsF16) { check(DType::kF16, -1); }

// Large logits must not overflow: the softmax is shifted by the row max.
TEST(CrossEntropy, LargeLogitsAreStable) {
  Variable logits(Tensor::from_vector({1000.0f, 0.0f, 1000.0f, 0.0f}, Shape{2, 2}), false);
  Tensor tg = Tensor::from_vector({0, 1}, Shape{2}, DType::kI32);
  const float loss = cross_entropy(logits, tg).value().to_vector()[0];
  EXPECT_NEAR(loss, 500.0f, 1e-3f);  // rows: ~0 and 1000
}

// Every target ignored: loss 0 and nothing added to the gradient (torch gives NaN here).
TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGrad) {
  Tensor buf = Tensor::zeros(Shape{2, 3, 5});
  Variable logits =
      Variable::bound_leaf(Tensor::from_vector(std::vector<float>(30, 1.5f), Shape{2, 3, 5}), buf);
  Tensor tg = Tensor::from_vector(std::vector<float>(6, -1.0f), Shape{2, 3}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable loss = cross_entropy(logits, tg);
  EXPECT_EQ(loss.value().to_vector()[0], 0.0f);
  tape.backward(loss);
  for (float g : buf.to_vector()) EXPECT_EQ(g, 0.0f);
}

TEST(CrossEntropyDeathTest, OutOfRangeTargetFailsCheck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Variable logits(Tensor::zeros(Shape{2, 5}), false);
  Tensor tg = Tensor::from_vector({0, 5}, Shape{2}, DType::kI32);
  EXPECT_DEATH(cross_entropy(logits, tg), "outside");
}

}  // namespace
}  // namespace fd::ops
