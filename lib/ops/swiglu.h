// swiglu: the gated activation of Llama's MLP, silu(gate) * up.
//
// Computed in fp32 with one rounding to the output dtype (Hugging Face rounds
// silu(gate) to the activation dtype before the product; the difference is
// within that dtype's rounding). sigmoid uses the branch-free exp of
// vec_math.h so the loops vectorise.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = gate * sigmoid(gate) * up, elementwise. gate, up: the same shape, any float dtypes;
// out has gate's dtype. CPU, GPU (both on it) and meta.
// Saves gate and up for backward.
Variable swiglu(const Variable& gate, const Variable& up);

}  // namespace fd::ops
