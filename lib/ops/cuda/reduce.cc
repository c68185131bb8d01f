// Whole-tensor reductions and in-place scaling on the GPU (kernels/optim.cu,
// elementwise.cu); sum_of_squares and all_finite synchronise.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

double sum_of_squares(const Tensor& t) {
  return kernels::sum_of_squares(t.raw(), gpu::dt(t.dtype()), t.numel());
}

void scale_(const Tensor& t, float factor) {
  kernels::cast(t.raw(), gpu::dt(t.dtype()), t.raw(), gpu::dt(t.dtype()), t.numel(), factor);
}

bool all_finite(const Tensor& t) {
  return kernels::all_finite(t.raw(), gpu::dt(t.dtype()), t.numel());
}

void add_(const Tensor& acc, const Tensor& x) {
  gpu::expect_cuda(x, "add_", "x");
  kernels::accumulate(acc.raw(), gpu::dt(acc.dtype()), x.raw(), gpu::dt(x.dtype()), acc.numel());
}

}  // namespace fd::ops::cuda
