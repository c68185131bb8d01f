// layernorm: normalise over the last dimension, then scale and shift (torch.nn.LayerNorm).
//
// Statistics are fp32 and the variance is biased (divides by C). The forward
// saves only the per-row mean and 1/std (rows floats each); backward
// recomputes the normalised values from x.
#pragma once

#include "lib/autograd/variable.h"
#include "lib/ops/elementwise.h"

namespace fd::ops {

using autograd::Variable;

// out = (x - mean) / sqrt(var + eps) * weight + bias, per row of the last dim.
// x: (..., C); weight: (C); bias: (C) or undefined for none. Any float dtypes; out has x's dtype.
// Saves x, weight, and fp32 mean and rstd (one per row) for backward.
Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias,
                   float eps = 1e-5f);

// The residual add and the LayerNorm after it (a block's x2 = x + attn; h = norm2(x2)):
// {x + y, layernorm(x + y, weight, bias)}, the same bits as add then layernorm. y has x's
// shape; the sum has x's dtype. On the GPU one kernel where x and y share a dtype; backward is
// one node that adds the norm's input gradient to the sum's and hands it to x and y without a
// copy or a zero fill.
AddNorm add_layernorm(const Variable& x, const Variable& y, const Variable& weight,
                      const Variable& bias, float eps = 1e-5f);

}  // namespace fd::ops
