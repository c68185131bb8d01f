// gelu on the GPU (kernels/elementwise.cu).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void gelu_forward(const Tensor& x, const Tensor& out) {
  kernels::gelu_forward(x.raw(), out.raw(), gpu::dt(x.dtype()), out.numel());
}

void gelu_backward(const Tensor& x, const Tensor& dy, autograd::GradSlot* dx_slot) {
  gpu::expect_cuda(dy, "gelu", "the output gradient");
  FD_CHECK(dy.dtype() == x.dtype(), "gelu: gradient dtype {} for x {}", dtype_name(dy.dtype()),
           dtype_name(x.dtype()));
  const autograd::GradSlot::Update u = dx_slot->grad_update();  // dx = prior + term: no zero fill
  kernels::gelu_backward(x.raw(), dy.raw(), gpu::dt(dy.dtype()), gpu::prior(u), u.out.raw(),
                         gpu::dt(u.out.dtype()), x.numel());
}

}  // namespace fd::ops::cuda
