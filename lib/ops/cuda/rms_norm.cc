// rms_norm on the GPU (kernels/norms.cu).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void rms_norm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out,
                      const Tensor& rstd) {
  gpu::expect_cuda(weight, "rms_norm", "weight");
  const int64_t C = weight.numel();  // a row: C consecutive elements (a head with q/k norm)
  kernels::rms_norm_forward(x.raw(), gpu::dt(x.dtype()), weight.raw(), gpu::dt(weight.dtype()),
                            out.raw(), gpu::dt(out.dtype()), rstd.data<float>(), x.numel() / C, C,
                            eps);
}

void add_rms_norm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, float eps,
                          const Tensor& sum, const Tensor& out, const Tensor& rstd) {
  gpu::expect_cuda(y, "add_rms_norm", "the residual");
  gpu::expect_cuda(weight, "add_rms_norm", "weight");
  FD_CHECK(y.dtype() == x.dtype() && sum.dtype() == x.dtype(), "add_rms_norm: x {}, y {}, sum {}",
           dtype_name(x.dtype()), dtype_name(y.dtype()), dtype_name(sum.dtype()));
  const int64_t C = weight.numel();
  kernels::add_rms_norm_forward(x.raw(), y.raw(), sum.raw(), gpu::dt(x.dtype()), weight.raw(),
                                gpu::dt(weight.dtype()), out.raw(), gpu::dt(out.dtype()),
                                rstd.data<float>(), x.numel() / C, C, eps);
}

void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                       autograd::GradSlot* xs, autograd::GradSlot* ws) {
  const bool want_x = xs != nullptr && xs->requires_grad;
  const bool want_w = ws != nullptr && ws->requires_grad;
  if (!want_x && !want_w) return;
  gpu::expect_cuda(dy, "rms_norm", "the output gradient");
  // The CPU's allocation order: the weight's gradient first.
  Tensor dw = want_w ? ws->ensure_grad() : Tensor();
  // No zero fill and no copy of a borrowed gradient: dx = prior + term.
  const autograd::GradSlot::Update ux = want_x ? xs->grad_update() : autograd::GradSlot::Update{};
  const Tensor& dx = ux.out;
  const int64_t C = weight.numel();
  kernels::rms_norm_backward(
      x.raw(), gpu::dt(x.dtype()), weight.raw(), gpu::dt(weight.dtype()), rstd.data<float>(),
      dy.raw(), gpu::dt(dy.dtype()), gpu::prior(ux), want_x ? dx.raw() : nullptr,
      gpu::dt(want_x ? dx.dtype() : DType::kF32), want_w ? dw.raw() : nullptr,
      gpu::dt(want_w ? dw.dtype() : DType::kF32), x.numel() / C, C);
}

}  // namespace fd::ops::cuda
