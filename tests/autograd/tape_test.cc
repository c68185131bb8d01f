#include "lib/autograd/tape.h"

#include <gtest/gtest.h>

namespace fd::autograd {
namespace {

// grad_to_write: the first write of a gradient gets a fresh buffer to overwrite
// (the GPU GEMMs use beta = 0 then, with no zero fill); later writes, and a
// bound leaf's caller-owned buffer, get the gradient there to accumulate into.
TEST(GradSlot, GradToWriteIsFirstOnlyForAGradientNotYetThere) {
  Variable y = Variable::op_output(Tensor::from_vector({1, 2, 3}, Shape{3}), true);
  bool first = false;
  const Tensor& g = y.slot()->grad_to_write(&first);
  EXPECT_TRUE(first);
  EXPECT_EQ(g.shape(), Shape{3});
  EXPECT_EQ(g.dtype(), DType::kF32);
  const void* buffer = g.raw();
  EXPECT_EQ(y.slot()->grad_to_write(&first).raw(), buffer);
  EXPECT_FALSE(first);
  EXPECT_EQ(y.slot()->ensure_grad().raw(), buffer);

  Tensor buf = Tensor::zeros(Shape{3});
  Variable w = Variable::bound_leaf(Tensor::from_vector({1, 2, 3}, Shape{3}), buf);
  EXPECT_EQ(w.slot()->grad_to_write(&first).raw(), buf.raw());
  EXPECT_FALSE(first) << "a bound leaf's buffer accumulates (micro-batches, tied weights)";
}

// y = x * 3 recorded by hand, to test the tape mechanics without ops.
Variable times_three(const Variable& x) {
  Tensor out = Tensor::empty(x.shape());
  for (int64_t i = 0; i < x.value().numel(); ++i) out.f32()[i] = 3 * x.value().f32()[i];
  bool rec = should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto xs = x.slot();
    auto ys = y.slot();
    current_tape().record({"times_three", {ys}, [xs, ys] {
                             if (!xs->requires_grad) return;
                             const Tensor& g = xs->ensure_grad();
                             for (int64_t i = 0; i < g.numel(); ++i)
                               g.f32()[i] += 3 * ys->grad.f32()[i];
                           }});
  }
  return y;
}

TEST(Tape, AccumulatesIntoBoundLeafAndFreesIntermediates) {
  Tensor buf = Tensor::zeros(Shape{4});
  buf.fill_(1.0f);  // pre-existing gradient: backward must add to it
  Variable x = Variable::bound_leaf(Tensor::from_vector({1, 2, 3, 4}, Shape{4}), buf);
  Tape tape;
  TapeScope scope(tape);
  Variable y = times_three(x);
  Variable z = times_three(y);
  EXPECT_EQ(tape.size(), 2u);
  tape.backward(z);
  EXPECT_EQ(tape.size(), 0u);
  for (float g : buf.to_vector()) EXPECT_EQ(g, 10.0f);  // 1 + 9
  EXPECT_FALSE(y.slot()->has_grad());                   // intermediate freed
}

TEST(Tape, NoGradGuardStopsRecording) {
  Variable x(Tensor::from_vector({1, 2}, Shape{2}), true);
  Tape tape;
  TapeScope scope(tape);
  {
    NoGradGuard guard;
    Variable y = times_three(x);
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(tape.size(), 0u);
  Variable y = times_three(x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(tape.size(), 1u);
}

}  // namespace
}  // namespace fd::autograd
