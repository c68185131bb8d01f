// Elementwise ops: the residual add, and scaling by a constant (the LoRA
// path's alpha / r).
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = a + b. a and b: same shape, any float dtypes; out has a's dtype.
// Saves nothing: backward adds dout into both gradients.
Variable add(const Variable& a, const Variable& b);

// out = x * factor. x: any shape, any float dtype; out: same shape and dtype
// (computed in fp32, then rounded). Saves nothing: backward adds
// dout * factor into x's gradient.
Variable scale(const Variable& x, float factor);

}  // namespace fd::ops
