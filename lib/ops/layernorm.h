// layernorm: normalise over the last dimension, then scale and shift (torch.nn.LayerNorm).
//
// Statistics are fp32 and the variance is biased (divides by C). The forward
// saves only the per-row mean and 1/std (rows floats each); backward
// recomputes the normalised values from x.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = (x - mean) / sqrt(var + eps) * weight + bias, per row of the last dim.
// x: (..., C); weight: (C); bias: (C) or undefined for none. Any float dtypes; out has x's dtype.
// Saves x, weight, and fp32 mean and rstd (one per row) for backward.
Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias,
                   float eps = 1e-5f);

}  // namespace fd::ops
