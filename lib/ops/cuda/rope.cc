// rope on the GPU (kernels/rope.cu): the tables must be on the GPU too
// (rope_tables builds them on the default device).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                  const Tensor& out) {
  gpu::expect_cuda(cos, "rope", "the cos table");
  if (positions.defined()) gpu::expect_cuda(positions, "rope", "the positions");
  gpu::expect_cuda(sin, "rope", "the sin table");
  const int64_t B = x.shape()[0], T = x.shape()[1];
  kernels::rope_forward(x.raw(), gpu::dt(x.dtype()), cos.data<float>(), sin.data<float>(),
                        positions.defined() ? positions.data<int32_t>() : nullptr, out.raw(),
                        gpu::dt(out.dtype()), B, T, x.numel() / (B * T), cos.shape().cols());
}

void rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                   autograd::GradSlot* dx) {
  gpu::expect_cuda(dy, "rope", "the output gradient");
  if (positions.defined()) gpu::expect_cuda(positions, "rope", "the positions");
  const autograd::GradSlot::Update u = dx->grad_update();  // dx = prior + term: no zero fill
  const Tensor& g = u.out;
  const int64_t B = dy.shape()[0], T = dy.shape()[1];
  kernels::rope_backward(dy.raw(), gpu::dt(dy.dtype()), cos.data<float>(), sin.data<float>(),
                         positions.defined() ? positions.data<int32_t>() : nullptr, gpu::prior(u),
                         g.raw(), gpu::dt(g.dtype()), B, T, dy.numel() / (B * T),
                         cos.shape().cols());
}

}  // namespace fd::ops::cuda
