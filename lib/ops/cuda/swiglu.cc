// swiglu on the GPU (kernels/elementwise.cu).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  gpu::expect_cuda(up, "swiglu", "up");
  kernels::swiglu_forward(gate.raw(), gpu::dt(gate.dtype()), up.raw(), gpu::dt(up.dtype()),
                          out.raw(), gpu::dt(out.dtype()), out.numel());
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, autograd::GradSlot* gs,
                     autograd::GradSlot* us) {
  const bool want_g = gs != nullptr && gs->requires_grad;
  const bool want_u = us != nullptr && us->requires_grad;
  if (!want_g && !want_u) return;
  gpu::expect_cuda(dy, "swiglu", "the output gradient");
  // Each gradient = prior + term: no zero fill, no copy of a borrowed one.
  const autograd::GradSlot::Update ug = want_g ? gs->grad_update() : autograd::GradSlot::Update{};
  const autograd::GradSlot::Update uu = want_u ? us->grad_update() : autograd::GradSlot::Update{};
  kernels::swiglu_backward(gate.raw(), gpu::dt(gate.dtype()), up.raw(), gpu::dt(up.dtype()),
                           dy.raw(), gpu::dt(dy.dtype()), gpu::prior(ug),
                           want_g ? ug.out.raw() : nullptr,
                           gpu::dt(want_g ? ug.out.dtype() : DType::kF32), gpu::prior(uu),
                           want_u ? uu.out.raw() : nullptr,
                           gpu::dt(want_u ? uu.out.dtype() : DType::kF32), gate.numel());
}

}  // namespace fd::ops::cuda
