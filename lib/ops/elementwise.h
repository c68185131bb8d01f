// Elementwise ops between tensors of the same shape (the residual add).
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = a + b. a and b: same shape, any float dtypes; out has a's dtype.
// Saves nothing: backward adds dout into both gradients.
Variable add(const Variable& a, const Variable& b);

}  // namespace fd::ops
