// adamw_update: one AdamW step over a flat range of fp32 parameters (no autograd).
//
// Bitwise-minded copy of torch.optim.AdamW's single-tensor path (amsgrad off):
// the bias corrections are computed in double, as torch does in Python, and
// the per-element arithmetic is fp32. lib/optim calls it once per contiguous
// run of equal weight decay.
#pragma once

#include "lib/tensor/tensor.h"

#include <cstdint>

namespace fd::ops {

struct AdamWStep {
  float lr;            // learning rate for this step (after any schedule)
  float beta1;         // first-moment decay
  float beta2;         // second-moment decay
  float eps;           // added to the bias-corrected sqrt(v)
  float weight_decay;  // decoupled: p *= 1 - lr * weight_decay
  int64_t step;        // 1 for the first step; bias corrections use it
};

// For i in [0, n): p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// denom = sqrt(v) / sqrt(1 - b2^step) + eps; p -= (lr / (1 - b1^step)) * m / denom.
// param, m, v are updated in place; all four arrays hold n fp32 values and do not overlap.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWStep& s);

// The same step over elements [offset, offset + n) of flat tensors, on their
// device (one fused loop per chunk on the CPU, one kernel on the GPU, nothing
// on meta): param, m, v fp32; grad in any float dtype, multiplied by
// grad_scale as it is read (the loss-scale and clip factor); when compute is
// defined (a 16-bit copy of param, same numel), the updated values are written
// into it too, rounded to nearest even. All tensors have the same numel.
void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s);

}  // namespace fd::ops
