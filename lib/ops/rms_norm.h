// rms_norm: root-mean-square normalisation over the last dimension, then a
// per-channel scale (Hugging Face LlamaRMSNorm).
//
// As LlamaRMSNorm: x is normalised in fp32, the normalised value is rounded
// to x's dtype, and only then multiplied by the weight. The forward saves the
// per-row 1/rms (rows floats); backward recomputes the normalised values.
#pragma once

#include "lib/autograd/variable.h"
#include "lib/ops/elementwise.h"

namespace fd::ops {

using autograd::Variable;

// out = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), per row of C elements.
// x: (..., k*C) for k >= 1; weight: (C). With k > 1 each group of C consecutive
// elements of the last dim is normalised on its own: Qwen3's q/k norm over each
// head of a (B, T, heads * head_dim) projection, without a reshape. Any float
// dtypes; out has x's dtype. CPU, GPU (weight there too) and meta. Saves x,
// weight and the fp32 rstd of each row for backward; the rounding to x's dtype
// is the identity there (straight through), as in autograd.
Variable rms_norm(const Variable& x, const Variable& weight, float eps = 1e-6f);

// The residual add and the RMSNorm after it (a block's x2 = x + attn; h = norm2(x2)):
// {x + y, rms_norm(x + y, weight)}, the same bits as add then rms_norm. y has x's shape; the
// sum has x's dtype. On the GPU one kernel where x and y share a dtype; backward is one node
// that adds the norm's input gradient to the sum's and hands it to x and y without a copy or a
// zero fill.
AddNorm add_rms_norm(const Variable& x, const Variable& y, const Variable& weight,
                     float eps = 1e-6f);

}  // namespace fd::ops
