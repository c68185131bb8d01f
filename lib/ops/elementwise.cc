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

Variable add(const Variable& a, const Variable& b) {
  FD_CHECK(a.shape() == b.shape(), "add: shapes {} and {}", a.shape().str(), b.shape().str());
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  if (a.value().is_cuda()) {
    cuda::add(a.value(), b.value(), out);
  } else {
    cpu::add(a.value(), b.value(), out);
  }
  bool rec = autograd::should_record({&a, &b});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto as = a.slot();
    auto bs = b.slot();
    autograd::current_tape().record({"add", {ys}, [ys, as, bs] {
                                       if (as->requires_grad)
                                         accumulate(as->ensure_grad(), ys->grad, 1.0f);
                                       if (bs->requires_grad)
                                         accumulate(bs->ensure_grad(), ys->grad, 1.0f);
                                     }});
  }
  return y;
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
