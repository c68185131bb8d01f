#include "lib/ops/layernorm.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias, float eps) {
  const int64_t C = x.shape().cols();
  const int64_t rows = x.shape().rows();
  FD_CHECK(x.shape().ndim() >= 1 && weight.shape() == Shape{C} &&
               (!bias.defined() || bias.shape() == Shape{C}),
           "layernorm: x {}, weight {}, bias {}", x.shape().str(), weight.shape().str(),
           bias.defined() ? bias.shape().str() : "none");
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor mean_t = Tensor::empty(Shape{rows});
  Tensor rstd_t = Tensor::empty(Shape{rows});
  const Tensor bias_t = bias.defined() ? bias.value() : Tensor();
  if (x.value().is_cuda()) {
    cuda::layernorm_forward(x.value(), weight.value(), bias_t, eps, out, mean_t, rstd_t);
  } else {
    cpu::layernorm_forward(x.value(), weight.value(), bias_t, eps, out, mean_t, rstd_t);
  }

  bool rec = autograd::should_record({&x, &weight, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    auto ws = weight.slot();
    auto bs = bias.defined() ? bias.slot() : nullptr;
    Tensor x_saved = x.value(), w_saved = weight.value();
    autograd::current_tape().record(
        {"layernorm", {ys}, [ys, xs, ws, bs, x_saved, w_saved, mean_t, rstd_t] {
           if (x_saved.is_cuda()) {
             cuda::layernorm_backward(x_saved, w_saved, mean_t, rstd_t, ys->grad, xs.get(),
                                      ws.get(), bs.get());
           } else {
             cpu::layernorm_backward(x_saved, w_saved, mean_t, rstd_t, ys->grad, xs.get(), ws.get(),
                                     bs.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
