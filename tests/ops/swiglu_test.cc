#include "lib/ops/swiglu.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kN = 3 * 7 * 12;

// Inputs {gate, up}: gate * sigmoid(gate) * up in float64.
Vec reference(const std::vector<Vec>& in) {
  Vec out(in[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = in[0][i];
    out[i] = g / (1.0 + std::exp(-g)) * in[1][i];
  }
  return out;
}

std::vector<Vec> inputs(DType dt) {
  std::mt19937 rng(7);
  Vec g = randn(kN, rng, 2.5);
  g[0] = 30.0;  // saturated tails
  g[1] = -30.0;
  g[2] = 0.0;
  return {rounded(g, dt), rounded(randn(kN, rng), dt)};
}

struct Result {
  Vec out, dg, du;
};

Result run(const std::vector<Vec>& in, const Vec& R, DType dt) {
  Variable gv(make_tensor(in[0], Shape{3, 7, 12}, dt), true);
  Variable uv(make_tensor(in[1], Shape{3, 7, 12}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = swiglu(gv, uv);
  EXPECT_EQ(y.dtype(), dt);
  backward_with(tape, y, R);
  return {values(y.value()), values(gv.grad()), values(uv.grad())};
}

void check(DType dt) {
  std::printf("swiglu %s\n", name_of(dt));
  const std::vector<Vec> in = inputs(dt);
  std::mt19937 rng(8);
  const Vec R = rounded(randn(kN, rng), dt);
  const Result got = run(in, R, dt);
  const double tol = tol_for(dt);
  expect_close("out", got.out, reference(in), tol);
  expect_close("grad gate", got.dg, fd_grad(reference, in, 0, R), tol);
  expect_close("grad up", got.du, fd_grad(reference, in, 1, R), tol);
}

TEST(Swiglu, GradF32) { check(DType::kF32); }
TEST(Swiglu, GradBF16) { check(DType::kBF16); }
TEST(Swiglu, GradF16) { check(DType::kF16); }

TEST(Swiglu, BF16MatchesF32) {
  std::printf("swiglu bf16 vs f32\n");
  const std::vector<Vec> in = inputs(DType::kBF16);
  std::mt19937 rng(8);
  const Vec R = rounded(randn(kN, rng), DType::kBF16);
  const Result f32 = run(in, R, DType::kF32);
  const Result bf16 = run(in, R, DType::kBF16);
  expect_close("out", bf16.out, f32.out, 1e-2);
  expect_close("grad gate", bf16.dg, f32.dg, 1e-2);
  expect_close("grad up", bf16.du, f32.du, 1e-2);
}

// Only the inputs that require a gradient get one.
TEST(Swiglu, FrozenUp) {
  const std::vector<Vec> in = inputs(DType::kF32);
  Variable gv(make_tensor(in[0], Shape{kN}, DType::kF32), true);
  Variable uv(make_tensor(in[1], Shape{kN}, DType::kF32), false);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = swiglu(gv, uv);
  backward_with(tape, y, Vec(kN, 1.0));
  EXPECT_TRUE(gv.grad().defined());
  EXPECT_FALSE(uv.grad().defined());
}

}  // namespace
}  // namespace fd::ops
