// adamw_update: one AdamW step over a flat range of fp32 parameters (no autograd).
//
// Bitwise-minded copy of torch.optim.AdamW's single-tensor path (amsgrad off):
// the bias corrections are computed in double, as torch does in Python, and
// the per-element arithmetic is fp32, each multiply, add, divide and sqrt
// rounded on its own in the order written (adamw.cc is built with
// -ffp-contract=off: no FMA). lib/optim calls it once per contiguous run of
// equal weight decay.
#pragma once

#include <cstdint>

#include "lib/tensor/tensor.h"

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
// In fp32, in this order: m = m + (1-b1) * (g - m) (torch's lerp_);
// v = b2 * v + ((1-b2) * g) * g; denom = sqrt(v) / bc2_sqrt + eps;
// p = p * decay - step_size * (m / denom), with decay = 1 - lr*wd,
// step_size = lr / (1 - b1^step) and bc2_sqrt = sqrt(1 - b2^step) computed in
// double and rounded once.
// param, m, v are updated in place; all four arrays hold n fp32 values and do not overlap.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWStep& s);

// The same step over elements [offset, offset + n) of flat tensors, on their
// device (one kernel on the GPU, nothing on meta): param, m, v fp32; grad in
// any float dtype, multiplied by grad_scale as it is read (the loss-scale and
// clip factor); when compute is defined (a 16-bit copy of param, same numel),
// the updated values are written into it too, rounded to nearest even, as
// convert_f32_to does. All tensors have the same numel.
//
// On the CPU: one fused pass, vectorised (AVX-512 or AVX2, whichever the CPU
// has, chosen at run time) and split over set_adamw_threads() threads; the
// result is bit for bit that of the pointer overload above applied to the
// fp32 gradients (grad converted, times grad_scale when it is not 1), whatever
// the instruction set and the thread count.
void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s);

// Threads for the CPU update (default 1; n >= 1): a call is split into up to
// n contiguous parts of at least 128 Ki elements (smaller calls run on the
// calling thread alone), run by the calling thread and n - 1 worker threads
// created on first need and reused. Elementwise, so the split cannot change a
// bit. Safe to call from any thread; calls made at the same time from several
// threads take turns.
void set_adamw_threads(int n);

}  // namespace fd::ops
