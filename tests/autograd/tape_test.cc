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

// grad_update: a slot with no gradient gets a fresh buffer and no prior (the op
// writes 0 + term: no zero fill); one that owns its gradient updates it in
// place; a borrowed one gets a fresh buffer to write and the borrowed gradient
// as the prior, which is not written.
TEST(GradSlot, GradUpdateWritesFreshInPlaceOrBesideABorrowedGradient) {
  Variable y = Variable::op_output(Tensor::from_vector({1, 2, 3}, Shape{3}), true);
  GradSlot::Update u = y.slot()->grad_update();
  EXPECT_FALSE(u.prior.defined());
  ASSERT_TRUE(u.out.defined());
  EXPECT_EQ(u.out.raw(), y.grad().raw());
  const void* own = u.out.raw();
  u = y.slot()->grad_update();
  EXPECT_EQ(u.out.raw(), own);
  EXPECT_EQ(u.prior.raw(), own);

  Tensor g = Tensor::from_vector({4, 5, 6}, Shape{3});
  Variable z = Variable::op_output(Tensor::from_vector({1, 2, 3}, Shape{3}), true);
  ASSERT_TRUE(z.slot()->take_shared(g));
  EXPECT_TRUE(z.slot()->borrowed);
  EXPECT_EQ(z.grad().raw(), g.raw());
  u = z.slot()->grad_update();
  EXPECT_EQ(u.prior.raw(), g.raw());
  EXPECT_NE(u.out.raw(), g.raw());
  EXPECT_EQ(z.grad().raw(), u.out.raw());
  EXPECT_FALSE(z.slot()->borrowed);
}

// take_shared hands a gradient over without a copy; writing into either slot
// afterwards (ensure_grad, grad_to_write) copies it first, so the other
// slot's gradient, and the tensor given, keep their values.
TEST(GradSlot, ASharedGradientIsCopiedBeforeAWrite) {
  Tensor g = Tensor::from_vector({1, 2, 3, 4}, Shape{2, 2});
  Variable a = Variable::op_output(Tensor::zeros(Shape{4}), true);
  Variable b = Variable::op_output(Tensor::zeros(Shape{4}), true);
  ASSERT_TRUE(a.slot()->take_shared(g));
  ASSERT_TRUE(b.slot()->take_shared(g));
  EXPECT_EQ(a.grad().shape(), Shape{4}) << "a view in the slot's shape";
  EXPECT_EQ(a.grad().raw(), g.raw());
  EXPECT_FALSE(a.slot()->take_shared(g)) << "a slot with a gradient takes none";
  const Tensor& ga = a.slot()->ensure_grad();
  EXPECT_NE(ga.raw(), g.raw());
  ga.f32()[0] += 10.0f;
  bool first = true;
  const Tensor& gb = b.slot()->grad_to_write(&first);
  EXPECT_FALSE(first);
  EXPECT_NE(gb.raw(), g.raw());
  gb.f32()[3] += 100.0f;
  EXPECT_EQ(a.grad().to_vector(), (std::vector<float>{11, 2, 3, 4}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{1, 2, 3, 104}));
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1, 2, 3, 4}));

  Variable h = Variable::op_output(Tensor::zeros(Shape{4}, DType::kBF16), true);
  EXPECT_FALSE(h.slot()->take_shared(g)) << "another dtype is converted by the caller";
  EXPECT_FALSE(h.slot()->has_grad());
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
