// add, scale and gradient accumulation on the GPU (kernels/elementwise.cu).
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  gpu::expect_cuda(b, "add", "b");
  kernels::add(a.raw(), gpu::dt(a.dtype()), b.raw(), gpu::dt(b.dtype()), out.raw(),
               gpu::dt(out.dtype()), out.numel());
}

void scale(const Tensor& x, float factor, const Tensor& out) {
  kernels::cast(x.raw(), gpu::dt(x.dtype()), out.raw(), gpu::dt(out.dtype()), out.numel(), factor);
}

void accumulate(const Tensor& dst, const Tensor& src, float factor) {
  gpu::expect_cuda(src, "add", "the gradient");
  kernels::accumulate(dst.raw(), gpu::dt(dst.dtype()), src.raw(), gpu::dt(src.dtype()), dst.numel(),
                      factor);
}

}  // namespace fd::ops::cuda
