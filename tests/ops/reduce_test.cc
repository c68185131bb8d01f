#include "lib/ops/reduce.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

// Longer than the 2048-element chunks used for 16-bit tensors, and not a multiple of them.
constexpr int64_t kN = 5000;

class Reduce : public ::testing::TestWithParam<DType> {};

TEST_P(Reduce, SumOfSquaresMatchesDouble) {
  const DType dt = GetParam();
  std::mt19937 rng(31);
  const Vec x = rounded(randn(kN, rng, 3.0), dt);
  double want = 0;
  for (double v : x) want += v * v;
  std::printf("sum_of_squares %s\n", name_of(dt));
  expect_close("sum", {sum_of_squares(make_tensor(x, Shape{kN}, dt))}, {want}, 1e-12);
}

TEST_P(Reduce, ScaleMultipliesInPlaceWithRounding) {
  const DType dt = GetParam();
  std::mt19937 rng(37);
  const Vec x = rounded(randn(kN, rng), dt);
  Tensor t = make_tensor(x, Shape{kN}, dt);
  scale_(t, 0.37f);
  // Each element is the fp32 product rounded once to the tensor's dtype.
  Vec want(kN);
  for (int64_t i = 0; i < kN; ++i) want[i] = float(x[i]) * 0.37f;
  want = rounded(want, dt);
  std::printf("scale_ %s\n", name_of(dt));
  expect_close("scaled", values(t), want, 0.0);
}

TEST_P(Reduce, AllFiniteDetectsInfAndNan) {
  const DType dt = GetParam();
  std::mt19937 rng(41);
  const Vec x = randn(kN, rng);
  EXPECT_TRUE(all_finite(make_tensor(x, Shape{kN}, dt)));
  for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
    for (int64_t pos : {int64_t(0), int64_t(2047), kN - 1}) {
      Vec y = x;
      y[pos] = bad;
      EXPECT_FALSE(all_finite(make_tensor(y, Shape{kN}, dt))) << bad << " at " << pos;
    }
  }
  // The largest finite value of the dtype is finite.
  Vec big = {dt == DType::kF16 ? 65504.0 : dt == DType::kBF16 ? 3.3895e38 : 3.4028e38};
  EXPECT_TRUE(all_finite(make_tensor(big, Shape{1}, dt)));
  // fp32 values that overflow f16 become inf when stored.
  if (dt == DType::kF16) {
    EXPECT_FALSE(all_finite(make_tensor({70000.0}, Shape{1}, dt)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Reduce, ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(name_of(info.param)); });

}  // namespace
}  // namespace fd::ops
