#include "lib/ops/adamw.h"

#include <cmath>

#include "lib/base/check.h"
#include "lib/ops/backend.h"
#include "lib/ops/cpu/adamw_isa.h"

namespace fd::ops {

namespace cpu {

// Bias corrections in double, as torch computes them in Python; shared with the
// SIMD kernels so that they multiply and divide by the very same floats.
AdamWScalars adamw_scalars(const AdamWStep& s) {
  FD_CHECK(s.step >= 1, "adamw_update: step {} (must be >= 1)", s.step);
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  return {float(1.0 - double(s.lr) * double(s.weight_decay)),
          float(double(s.lr) / bc1),
          float(std::sqrt(bc2)),
          s.beta1,
          s.beta2,
          s.eps,
          1.0f - s.beta1,
          1.0f - s.beta2};
}

}  // namespace cpu

// The reference every CPU kernel is tested against bit for bit. This file is
// built with -ffp-contract=off (CMakeLists.txt), so each fp32 operation below is
// rounded on its own, as torch's are; g++ may still vectorise the loop (with
// -fno-math-errno, as sqrt's errno path is a branch), which changes no bits.
void adamw_update(float* __restrict param, const float* __restrict grad, float* __restrict m,
                  float* __restrict v, int64_t n, const AdamWStep& s) {
  const cpu::AdamWScalars k = cpu::adamw_scalars(s);
  const float decay = k.decay, step_size = k.step_size, bc2_sqrt = k.bc2_sqrt;
  const float b2 = k.beta2, eps = k.eps;
  const float one_minus_b1 = k.one_minus_beta1, one_minus_b2 = k.one_minus_beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    // torch: exp_avg.lerp_(grad, 1 - beta1), i.e. m + (1 - b1) (g - m).
    const float mi = m[i] + one_minus_b1 * (g - m[i]);
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s) {
  FD_CHECK(param.dtype() == DType::kF32 && m.dtype() == DType::kF32 && v.dtype() == DType::kF32,
           "adamw: parameters and moments must be fp32");
  FD_CHECK(offset >= 0 && offset + n <= param.numel() && param.numel() == grad.numel() &&
               param.numel() == m.numel() && param.numel() == v.numel() &&
               (!compute.defined() || compute.numel() == param.numel()),
           "adamw: range [{}, {}) of tensors with {} / {} / {} / {} elements", offset, offset + n,
           param.numel(), grad.numel(), m.numel(), v.numel());
  if (param.is_cuda())
    return cuda::adamw_update(param, grad, grad_scale, m, v, compute, offset, n, s);
  cpu::adamw_update(param, grad, grad_scale, m, v, compute, offset, n, s);
}

}  // namespace fd::ops
