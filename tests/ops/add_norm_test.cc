// add_layernorm and add_rms_norm (the residual add fused with the norm after
// it) against ops::add followed by the norm, bit for bit: both outputs, and
// every gradient (x, y, the weight, the bias) with gradients arriving at both
// outputs, at only one, into an x that already has a gradient (a bound leaf),
// with x given twice, and with y in another dtype (the fallback path). Then a
// decoder block's backward hands the residual's gradient on without copies:
// its addends share one tensor.
#include "lib/ops/layernorm.h"
#include "lib/ops/rms_norm.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

enum class Kind { kLayer, kRms };
enum class Seeds { kBoth, kNormedOnly, kSumOnly };

constexpr int64_t kRows = 6, kC = 40;

struct Inputs {
  Vec x, y, w, b, gs, gh, prior;
};

struct Result {
  Vec sum, normed, gx, gy, gw, gb;
};

Inputs make_inputs(DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = kRows * kC;
  Inputs in;
  in.x = rounded(randn(n, rng, 2.0), dt);
  in.y = rounded(randn(n, rng), dt);
  in.w = randn(kC, rng);
  in.b = randn(kC, rng);
  in.gs = rounded(randn(n, rng), dt);
  in.gh = rounded(randn(n, rng), dt);
  in.prior = randn(n, rng);
  return in;
}

// fused: add_*norm; else add, then the norm. x_is_y: both addends are x.
// bound: x's gradient accumulates into a buffer holding `prior`.
Result run(Kind kind, bool fused, const Inputs& in, DType dt, DType y_dt, Seeds seeds, bool x_is_y,
           bool bound) {
  const Shape shape{2, 3, kC};
  Tensor xg = make_tensor(in.prior, shape, DType::kF32);
  Variable x = bound ? Variable::bound_leaf(make_tensor(in.x, shape, dt), xg)
                     : Variable(make_tensor(in.x, shape, dt), true);
  Variable y = x_is_y ? x : Variable(make_tensor(in.y, shape, y_dt), true);
  Variable w(make_tensor(in.w, Shape{kC}, DType::kF32), true);
  Variable b(make_tensor(in.b, Shape{kC}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  AddNorm r;
  if (fused) {
    r = kind == Kind::kLayer ? add_layernorm(x, y, w, b) : add_rms_norm(x, y, w);
  } else {
    r.sum = add(x, y);
    r.normed = kind == Kind::kLayer ? layernorm(r.sum, w, b) : rms_norm(r.sum, w);
  }
  Result out{values(r.sum.value()), values(r.normed.value()), {}, {}, {}, {}};
  if (seeds != Seeds::kNormedOnly)
    r.sum.slot()->ensure_grad().copy_from(make_tensor(in.gs, shape, dt));
  if (seeds != Seeds::kSumOnly)
    r.normed.slot()->ensure_grad().copy_from(make_tensor(in.gh, shape, dt));
  tape.run_backward();
  out.gx = values(x.grad());
  if (!x_is_y) out.gy = values(y.grad());
  if (w.slot()->has_grad()) out.gw = values(w.grad());
  if (kind == Kind::kLayer && b.slot()->has_grad()) out.gb = values(b.grad());
  return out;
}

void expect_same(Kind kind, DType dt, DType y_dt, Seeds seeds, bool x_is_y, bool bound) {
  SCOPED_TRACE(std::string(kind == Kind::kLayer ? "layernorm" : "rms_norm") + " " + name_of(dt) +
               " y " + name_of(y_dt) + " seeds " + std::to_string(int(seeds)) +
               (x_is_y ? " x+x" : "") + (bound ? " bound" : ""));
  const Inputs in = make_inputs(dt, 7 + uint32_t(dt) * 3 + uint32_t(seeds));
  const Result a = run(kind, true, in, dt, y_dt, seeds, x_is_y, bound);
  const Result b = run(kind, false, in, dt, y_dt, seeds, x_is_y, bound);
  EXPECT_EQ(a.sum, b.sum);
  EXPECT_EQ(a.normed, b.normed);
  EXPECT_EQ(a.gx, b.gx);
  EXPECT_EQ(a.gy, b.gy);
  EXPECT_EQ(a.gw, b.gw);
  EXPECT_EQ(a.gb, b.gb);
  EXPECT_EQ(a.gx.size(), size_t(kRows * kC));
  EXPECT_EQ(a.gw.empty(), seeds == Seeds::kSumOnly) << "the weight's gradient comes from the norm";
}

void expect_same_everywhere(Kind kind) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Seeds s : {Seeds::kBoth, Seeds::kNormedOnly, Seeds::kSumOnly})
      expect_same(kind, dt, dt, s, false, false);
    expect_same(kind, dt, dt, Seeds::kBoth, true, false);
    expect_same(kind, dt, dt, Seeds::kBoth, false, true);
    expect_same(kind, dt, DType::kF32, Seeds::kBoth, false, false);
  }
}

TEST(AddNorm, LayerNormIsAddThenLayerNormBitForBit) { expect_same_everywhere(Kind::kLayer); }
TEST(AddNorm, RmsNormIsAddThenRmsNormBitForBit) { expect_same_everywhere(Kind::kRms); }

// The gradient reaching the sum is handed to both addends as one tensor (no
// copy, no zero fill), and the norm's term is added to the sum's gradient
// where it is: x's and y's gradients are the same memory until one is written.
TEST(AddNorm, BackwardHandsOneGradientToBothAddends) {
  const Inputs in = make_inputs(DType::kF32, 3);
  const Shape shape{2, 3, kC};
  Variable x = Variable::op_output(make_tensor(in.x, shape, DType::kF32), true);
  Variable y = Variable::op_output(make_tensor(in.y, shape, DType::kF32), true);
  Variable w(make_tensor(in.w, Shape{kC}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  AddNorm r = add_rms_norm(x, y, w);
  r.sum.slot()->ensure_grad().copy_from(make_tensor(in.gs, shape, DType::kF32));
  r.normed.slot()->ensure_grad().copy_from(make_tensor(in.gh, shape, DType::kF32));
  const void* sum_grad = r.sum.grad().raw();
  tape.run_backward();
  ASSERT_TRUE(x.slot()->has_grad() && y.slot()->has_grad());
  EXPECT_EQ(x.grad().raw(), y.grad().raw());
  EXPECT_EQ(x.grad().raw(), sum_grad) << "the sum owned its gradient: updated in place";
  EXPECT_TRUE(x.slot()->borrowed && y.slot()->borrowed);
}

}  // namespace
}  // namespace fd::ops
