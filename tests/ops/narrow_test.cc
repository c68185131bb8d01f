#include "lib/ops/narrow.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

// narrow_last against its definition; the gradient against float64 finite differences, added
// into an existing gradient (x also feeds another use).
void check(DType dt, int64_t begin, int64_t count) {
  std::printf("narrow_last %s [%lld, %lld) of 12\n", name_of(dt), (long long)begin,
              (long long)(begin + count));
  constexpr int64_t kRows = 6, kC = 12;
  std::mt19937 rng(5);
  std::vector<Vec> in = {rounded(randn(kRows * kC, rng), dt)};
  const Vec R = rounded(randn(kRows * count, rng), dt);
  RefFn ref = [&](const std::vector<Vec>& x) {
    Vec out;
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < count; ++j) out.push_back(x[0][r * kC + begin + j]);
    return out;
  };
  Variable x(make_tensor(in[0], Shape{2, 3, kC}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = narrow_last(x, begin, count);
  EXPECT_EQ(y.shape(), (Shape{2, 3, count}));
  expect_close("out", values(y.value()), ref(in), 0.0);
  backward_with(tape, y, R);
  expect_close("grad x", values(x.grad()), fd_grad(ref, in, 0, R), tol_for(dt));
}

TEST(NarrowLast, GradF32) {
  check(DType::kF32, 0, 4);
  check(DType::kF32, 8, 4);
  check(DType::kF32, 3, 1);
}
TEST(NarrowLast, GradBF16) { check(DType::kBF16, 4, 8); }
TEST(NarrowLast, GradF16) { check(DType::kF16, 2, 10); }

TEST(NarrowLastDeathTest, RefusesARangeOutsideTheDimension) {
  Variable x(Tensor::zeros(Shape{2, 12}, DType::kF32), false);
  EXPECT_DEATH(narrow_last(x, 10, 4), "columns \\[10, 14\\) of a last dimension of 12");
  EXPECT_DEATH(narrow_last(x, 0, 0), "columns");
}

}  // namespace
}  // namespace fd::ops
