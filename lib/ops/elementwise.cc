#include "lib/ops/elementwise.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {
namespace {

// dst += src * factor, on dst's device.
void accumulate(const Tensor& dst, const Tensor& src, float factor) {
  if (dst.is_cuda()) return cuda::accumulate(dst, src, factor);
  cpu::accumulate(dst, src, factor);
}

}  // namespace

void add_values(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (a.is_cuda()) return cuda::add(a, b, out);
  cpu::add(a, b, out);
}

void pass_grad(autograd::GradSlot& slot, const Tensor& g) {
  if (!slot.requires_grad || slot.take_shared(g)) return;
  accumulate(slot.ensure_grad(), g, 1.0f);
}

Variable add(const Variable& a, const Variable& b) {
  FD_CHECK(a.shape() == b.shape(), "add: shapes {} and {}", a.shape().str(), b.shape().str());
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  add_values(a.value(), b.value(), out);
  bool rec = autograd::should_record({&a, &b});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto as = a.slot();
    auto bs = b.slot();
    autograd::current_tape().record({"add", {ys}, [ys, as, bs] {
                                       pass_grad(*as, ys->grad);
                                       pass_grad(*bs, ys->grad);
                                     }});
  }
  return y;
}

void add_norm_backward(autograd::GradSlot& sum_slot, const autograd::GradSlot& normed_slot,
                       autograd::GradSlot& xs, autograd::GradSlot& ys,
                       const std::function<void(autograd::GradSlot*)>& norm_backward) {
  autograd::GradSlot d;  // the sum's whole gradient, written in place only where sum_slot owns it
  d.shape = sum_slot.shape;
  d.dtype = sum_slot.dtype;
  d.device = sum_slot.device;
  d.is_leaf = false;
  d.requires_grad = xs.requires_grad || ys.requires_grad;
  if (sum_slot.has_grad()) {
    d.grad = sum_slot.grad;
    d.borrowed = sum_slot.borrowed;
  }
  if (normed_slot.has_grad()) norm_backward(&d);  // the weight's gradient even when d needs none
  if (!d.has_grad() || !d.requires_grad) return;
  pass_grad(xs, d.grad);
  pass_grad(ys, d.grad);
}

Variable scale(const Variable& x, float factor) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (x.value().is_cuda()) {
    cuda::scale(x.value(), factor, out);
  } else {
    cpu::scale(x.value(), factor, out);
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"scale", {ys}, [ys, xs, factor] {
                                       if (xs->requires_grad)
                                         accumulate(xs->ensure_grad(), ys->grad, factor);
                                     }});
  }
  return y;
}

}  // namespace fd::ops
