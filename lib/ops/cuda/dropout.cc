// dropout on the GPU (kernels/elementwise.cu): the same counter-based mask.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t stream) {
  kernels::dropout_forward(x.raw(), out.raw(), gpu::dt(x.dtype()), out.numel(), p, seed, stream);
}

void dropout_backward(const Tensor& dy, autograd::GradSlot* dx_slot, float p, uint64_t seed,
                      uint64_t stream) {
  const autograd::GradSlot::Update u = dx_slot->grad_update();  // dx = prior + term: no zero fill
  kernels::dropout_backward(dy.raw(), gpu::dt(dy.dtype()), gpu::prior(u), u.out.raw(),
                            gpu::dt(u.out.dtype()), dy.numel(), p, seed, stream);
}

}  // namespace fd::ops::cuda
