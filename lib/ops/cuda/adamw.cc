// AdamW over flat tensors on the GPU: one fused kernel per range (kernels/optim.cu).
#include <cmath>

#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s) {
  for (const Tensor* t : {&param, &grad, &m, &v, &compute})
    gpu::expect_cuda(*t, "adamw", "a state tensor");
  // Bias corrections in double, as torch computes them in Python.
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  kernels::AdamWArgs a{s.lr,
                       s.beta1,
                       s.beta2,
                       s.eps,
                       s.weight_decay,
                       float(double(s.lr) / bc1),
                       float(std::sqrt(bc2)),
                       grad_scale};
  const size_t gsize = dtype_size(grad.dtype());
  void* out16 = compute.defined() ? static_cast<char*>(compute.raw()) +
                                        size_t(offset) * dtype_size(compute.dtype())
                                  : nullptr;
  kernels::adamw(param.data<float>() + offset,
                 static_cast<const char*>(grad.raw()) + size_t(offset) * gsize,
                 gpu::dt(grad.dtype()), m.data<float>() + offset, v.data<float>() + offset, n, a,
                 out16, gpu::dt(compute.defined() ? compute.dtype() : DType::kBF16));
}

}  // namespace fd::ops::cuda
