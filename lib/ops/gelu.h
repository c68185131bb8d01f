// gelu: the tanh approximation of GELU, as torch F.gelu(approximate='tanh') and GPT-2.
//
// tanh is computed with a branch-free exp so the loops vectorise.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise.
// x: any shape, any float dtype; out: same shape and dtype. Saves x for backward.
Variable gelu(const Variable& x);

}  // namespace fd::ops
