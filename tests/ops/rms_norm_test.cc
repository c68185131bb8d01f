#include "lib/ops/rms_norm.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kRows = 3 * 7, kC = 12;
constexpr double kEps = 1e-6;

// Inputs {x, weight}: w * x / sqrt(mean(x^2) + eps), in float64 (no intermediate rounding).
Vec reference(const std::vector<Vec>& in) {
  Vec out(kRows * kC);
  for (int64_t r = 0; r < kRows; ++r) {
    const double* x = in[0].data() + r * kC;
    double ms = 0;
    for (int64_t i = 0; i < kC; ++i) ms += x[i] * x[i] / kC;
    for (int64_t i = 0; i < kC; ++i) out[r * kC + i] = in[1][i] * x[i] / std::sqrt(ms + kEps);
  }
  return out;
}

std::vector<Vec> inputs(DType dt, DType wdt) {
  std::mt19937 rng(3);
  Vec x = randn(kRows * kC, rng, 2.0);
  for (double& v : x) v += 0.5;
  Vec w = randn(kC, rng, 0.5);
  for (double& v : w) v += 1.0;
  return {rounded(x, dt), rounded(w, wdt)};
}

struct Result {
  Vec out, dx, dw;
};

Result run(const std::vector<Vec>& in, const Vec& R, DType dt, DType wdt) {
  Variable xv(make_tensor(in[0], Shape{3, 7, kC}, dt), true);
  Variable wv(make_tensor(in[1], Shape{kC}, wdt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = rms_norm(xv, wv, float(kEps));
  EXPECT_EQ(y.dtype(), dt);
  backward_with(tape, y, R);
  return {values(y.value()), values(xv.grad()), values(wv.grad())};
}

// x in dtype dt; weight in wdt.
void check(DType dt, DType wdt) {
  std::printf("rms_norm x:%s weight:%s\n", name_of(dt), name_of(wdt));
  const std::vector<Vec> in = inputs(dt, wdt);
  std::mt19937 rng(4);
  const Vec R = rounded(randn(kRows * kC, rng), dt);
  const Result got = run(in, R, dt, wdt);
  const double tol = std::max(tol_for(dt), tol_for(wdt));
  expect_close("out", got.out, reference(in), tol);
  expect_close("grad x", got.dx, fd_grad(reference, in, 0, R), tol);
  expect_close("grad weight", got.dw, fd_grad(reference, in, 1, R), tol);
}

TEST(RmsNorm, GradF32) { check(DType::kF32, DType::kF32); }
TEST(RmsNorm, GradBF16) { check(DType::kBF16, DType::kBF16); }
TEST(RmsNorm, GradF16) { check(DType::kF16, DType::kF16); }
TEST(RmsNorm, GradBF16ActivationsF32Weights) { check(DType::kBF16, DType::kF32); }

// The bf16 path against the f32 path on the same (bf16-representable) inputs.
TEST(RmsNorm, BF16MatchesF32) {
  std::printf("rms_norm bf16 vs f32\n");
  const std::vector<Vec> in = inputs(DType::kBF16, DType::kBF16);
  std::mt19937 rng(4);
  const Vec R = rounded(randn(kRows * kC, rng), DType::kBF16);
  const Result f32 = run(in, R, DType::kF32, DType::kF32);
  const Result bf16 = run(in, R, DType::kBF16, DType::kBF16);
  expect_close("out", bf16.out, f32.out, 1e-2);
  expect_close("grad x", bf16.dx, f32.dx, 1e-2);
  expect_close("grad weight", bf16.dw, f32.dw, 1e-2);
}

// LlamaRMSNorm's order: the normalised x is rounded to bf16, then multiplied by the weight.
TEST(RmsNorm, BF16RoundsBeforeTheWeight) {
  const Vec x = rounded({1.0, 2.0, 3.0, 5.0}, DType::kBF16);
  const Vec w = rounded({1.1, 0.7, 1.3, 0.9}, DType::kBF16);
  Variable xv(make_tensor(x, Shape{1, 4}, DType::kBF16), false);
  Variable wv(make_tensor(w, Shape{4}, DType::kBF16), false);
  const Vec got = values(rms_norm(xv, wv, 0.0f).value());
  const float rstd = 1.0f / std::sqrt((1.0f + 4.0f + 9.0f + 25.0f) / 4.0f);
  for (size_t i = 0; i < 4; ++i) {
    const double n = rounded({double(float(x[i]) * rstd)}, DType::kBF16)[0];
    const double want = rounded({double(float(w[i]) * float(n))}, DType::kBF16)[0];
    EXPECT_EQ(got[i], want) << i;
  }
}


// Per-head norm (Qwen3's q/k norm): x (3, 7, 4 * 3) with weight (3) normalises
// each group of 3 consecutive elements on its own, the same as x viewed as
// (3, 7, 4, 3) with rows of 3.
TEST(RmsNorm, GroupsOfTheLastDimAreRowsOfTheirOwn) {
  constexpr int64_t kHeadDim = 3;
  std::mt19937 rng(7);
  const Vec x = randn(kRows * kC, rng, 2.0), w = randn(kHeadDim, rng, 0.5),
            R = randn(kRows * kC, rng);
  auto run_shape = [&](Shape xs) {
    Variable xv(make_tensor(x, xs, DType::kF32), true);
    Variable wv(make_tensor(w, Shape{kHeadDim}, DType::kF32), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = rms_norm(xv, wv, float(kEps));
    backward_with(tape, y, R);
    return Result{values(y.value()), values(xv.grad()), values(wv.grad())};
  };
  const Result grouped = run_shape(Shape{3, 7, kC});
  const Result rows = run_shape(Shape{3, 7, kC / kHeadDim, kHeadDim});
  EXPECT_EQ(grouped.out, rows.out);
  EXPECT_EQ(grouped.dx, rows.dx);
  EXPECT_EQ(grouped.dw, rows.dw);
  // And the float64 reference per group.
  for (int64_t g = 0; g < kRows * kC / kHeadDim; ++g) {
    double ms = 0;
    for (int64_t i = 0; i < kHeadDim; ++i) ms += x[g * kHeadDim + i] * x[g * kHeadDim + i] / kHeadDim;
    for (int64_t i = 0; i < kHeadDim; ++i)
      EXPECT_NEAR(grouped.out[g * kHeadDim + i], w[i] * x[g * kHeadDim + i] / std::sqrt(ms + kEps),
                  1e-5);
  }
}

// A weight that does not tile the last dim is a failed check, not a silent misread.
TEST(RmsNorm, WeightMustTileTheLastDim) {
  std::mt19937 rng(8);
  Variable xv(make_tensor(randn(2 * 10, rng), Shape{2, 10}, DType::kF32), true);
  Variable wv(make_tensor(randn(4, rng), Shape{4}, DType::kF32), true);
  EXPECT_DEATH(rms_norm(xv, wv), "rms_norm: x");
}

}  // namespace
}  // namespace fd::ops
