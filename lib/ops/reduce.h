// Whole-tensor reductions and in-place scaling for the optimizer and the
// loss scaler: gradient-norm clipping and the fp16 overflow check.
#pragma once

#include "lib/tensor/tensor.h"

namespace fd::ops {

// Sum of t[i]^2 over all elements, accumulated in double. t: f32, bf16 or f16.
double sum_of_squares(const Tensor& t);

// t[i] *= factor in place (16-bit results rounded to nearest even). t: f32, bf16 or f16.
void scale_(const Tensor& t, float factor);

// False if any element is inf or NaN. t: f32, bf16 or f16.
bool all_finite(const Tensor& t);
// acc[i] += x[i] (same numel, same device), computed in fp32 and stored in acc's dtype.
void add_(const Tensor& acc, const Tensor& x);

// Each runs on the tensor's device; the GPU forms of sum_of_squares and
// all_finite synchronise to return their value. On meta tensors (no values)
// sum_of_squares is 0, all_finite is true, and scale_ and add_ do nothing.

}  // namespace fd::ops
