#include "lib/ops/gelu.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable gelu(const Variable& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (x.value().is_cuda()) {
    cuda::gelu_forward(x.value(), out);
  } else {
    cpu::gelu_forward(x.value(), out);
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    Tensor x_saved = x.value();
    autograd::current_tape().record({"gelu", {ys}, [ys, xs, x_saved] {
                                       if (!xs->requires_grad) return;
                                       if (x_saved.is_cuda()) {
                                         cuda::gelu_backward(x_saved, ys->grad, xs.get());
                                       } else {
                                         cpu::gelu_backward(x_saved, ys->grad, xs.get());
                                       }
                                     }});
  }
  return y;
}

}  // namespace fd::ops
