#include "lib/ops/rms_norm.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable rms_norm(const Variable& x, const Variable& weight, float eps) {
  const int64_t C = weight.shape().ndim() == 1 ? weight.shape()[0] : 0;
  FD_CHECK(x.shape().ndim() >= 1 && C > 0 && x.shape().cols() % C == 0,
           "rms_norm: x {}, weight {}", x.shape().str(), weight.shape().str());
  const int64_t rows = x.shape().numel() / C;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor rstd_t = Tensor::empty(Shape{rows});
  if (x.value().is_cuda()) {
    cuda::rms_norm_forward(x.value(), weight.value(), eps, out, rstd_t);
  } else {
    cpu::rms_norm_forward(x.value(), weight.value(), eps, out, rstd_t);
  }

  bool rec = autograd::should_record({&x, &weight});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    auto ws = weight.slot();
    Tensor x_saved = x.value(), w_saved = weight.value();
    autograd::current_tape().record(
        {"rms_norm", {ys}, [ys, xs, ws, x_saved, w_saved, rstd_t] {
           if (x_saved.is_cuda()) {
             cuda::rms_norm_backward(x_saved, w_saved, rstd_t, ys->grad, xs.get(), ws.get());
           } else {
             cpu::rms_norm_backward(x_saved, w_saved, rstd_t, ys->grad, xs.get(), ws.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
