// layernorm on the GPU (kernels/norms.cu).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  gpu::expect_cuda(weight, "layernorm", "weight");
  if (bias.defined()) {
    gpu::expect_cuda(bias, "layernorm", "bias");
    FD_CHECK(bias.dtype() == weight.dtype(), "layernorm: weight {} and bias {}",
             dtype_name(weight.dtype()), dtype_name(bias.dtype()));
  }
  kernels::layernorm_forward(x.raw(), gpu::dt(x.dtype()), weight.raw(),
                             bias.defined() ? bias.raw() : nullptr, gpu::dt(weight.dtype()),
                             out.raw(), gpu::dt(out.dtype()), mean.data<float>(),
                             rstd.data<float>(), x.shape().rows(), x.shape().cols(), eps);
}

void add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight,
                           const Tensor& bias, float eps, const Tensor& sum, const Tensor& out,
                           const Tensor& mean, const Tensor& rstd) {
  gpu::expect_cuda(y, "add_layernorm", "the residual");
  gpu::expect_cuda(weight, "add_layernorm", "weight");
  if (bias.defined()) gpu::expect_cuda(bias, "add_layernorm", "bias");
  FD_CHECK(y.dtype() == x.dtype() && sum.dtype() == x.dtype(), "add_layernorm: x {}, y {}, sum {}",
           dtype_name(x.dtype()), dtype_name(y.dtype()), dtype_name(sum.dtype()));
  kernels::add_layernorm_forward(x.raw(), y.raw(), sum.raw(), gpu::dt(x.dtype()), weight.raw(),
                                 bias.defined() ? bias.raw() : nullptr, gpu::dt(weight.dtype()),
                                 out.raw(), gpu::dt(out.dtype()), mean.data<float>(),
                                 rstd.data<float>(), x.shape().rows(), x.shape().cols(), eps);
}

void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dy, autograd::GradSlot* xs,
                        autograd::GradSlot* ws, autograd::GradSlot* bs) {
  gpu::expect_cuda(dy, "layernorm", "the output gradient");
  const bool want_w = ws != nullptr && ws->requires_grad;
  const bool want_b = bs != nullptr && bs->requires_grad;
  // No zero fill and no copy of a borrowed gradient: dx = prior + term.
  const autograd::GradSlot::Update ux =
      xs != nullptr && xs->requires_grad ? xs->grad_update() : autograd::GradSlot::Update{};
  const Tensor& dx = ux.out;
  Tensor dw = want_w ? ws->ensure_grad() : Tensor();
  Tensor db = want_b ? bs->ensure_grad() : Tensor();
  FD_CHECK(!want_w || !want_b || dw.dtype() == db.dtype(),
           "layernorm: weight and bias gradients in {} and {}", dtype_name(dw.dtype()),
           dtype_name(db.dtype()));
  const DType gdt = want_w ? dw.dtype() : want_b ? db.dtype() : DType::kF32;
  kernels::layernorm_backward(x.raw(), gpu::dt(x.dtype()), weight.raw(), gpu::dt(weight.dtype()),
                              mean.data<float>(), rstd.data<float>(), dy.raw(), gpu::dt(dy.dtype()),
                              gpu::prior(ux), dx.defined() ? dx.raw() : nullptr,
                              gpu::dt(dx.defined() ? dx.dtype() : DType::kF32),
                              want_w ? dw.raw() : nullptr, want_b ? db.raw() : nullptr,
                              gpu::dt(gdt), x.shape().rows(), x.shape().cols());
}

}  // namespace fd::ops::cuda
