// causal_attention on the GPU (kernels/attention.cu: FlashAttention-2 style,
// deterministic backward).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void attention_forward(const Tensor& qkv, AttentionDims d, const Tensor& out, const Tensor& lse) {
  kernels::attention_forward(qkv.raw(), out.raw(), lse.data<float>(), gpu::dt(qkv.dtype()), d.B,
                             d.T, d.C, d.n_head);
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dy,
                        AttentionDims d, autograd::GradSlot* dqkv) {
  gpu::expect_cuda(dy, "causal_attention", "the output gradient");
  FD_CHECK(dy.dtype() == qkv.dtype(), "causal_attention: gradient {} for qkv {}",
           dtype_name(dy.dtype()), dtype_name(qkv.dtype()));
  const Tensor& dx = dqkv->ensure_grad();
  kernels::attention_backward(qkv.raw(), out.raw(), lse.data<float>(), dy.raw(),
                              gpu::dt(dy.dtype()), dx.raw(), gpu::dt(dx.dtype()), d.B, d.T, d.C,
                              d.n_head);
}

}  // namespace fd::ops::cuda
