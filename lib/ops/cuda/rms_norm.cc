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

void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                       autograd::GradSlot* xs, autograd::GradSlot* ws) {
  const bool want_x = xs != nullptr && xs->requires_grad;
  const bool want_w = ws != nullptr && ws->requires_grad;
  if (!want_x && !want_w) return;
  gpu::expect_cuda(dy, "rms_norm", "the output gradient");
  // The CPU's allocation order: the weight's gradient first.
  Tensor dw = want_w ? ws->ensure_grad() : Tensor();
  Tensor dx = want_x ? xs->ensure_grad() : Tensor();
  const int64_t C = weight.numel();
  kernels::rms_norm_backward(
      x.raw(), gpu::dt(x.dtype()), weight.raw(), gpu::dt(weight.dtype()), rstd.data<float>(),
      dy.raw(), gpu::dt(dy.dtype()), want_x ? dx.raw() : nullptr,
      gpu::dt(want_x ? dx.dtype() : DType::kF32), want_w ? dw.raw() : nullptr,
      gpu::dt(want_w ? dw.dtype() : DType::kF32), x.numel() / C, C);
}

}  // namespace fd::ops::cuda
