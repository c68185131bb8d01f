// Elementwise ops: the residual add, and scaling by a constant (the LoRA
// path's alpha / r).
#pragma once

#include <functional>

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = a + b. a and b: same shape, any float dtypes; out has a's dtype.
// Saves nothing: backward hands dout to both inputs (pass_grad: no copy, no
// zero fill, where they have no gradient yet).
Variable add(const Variable& a, const Variable& b);

// out = a + b on a's device, without recording (the add op's arithmetic: fp32 sum, rounded to
// out's dtype).
void add_values(const Tensor& a, const Tensor& b, const Tensor& out);

// Gives `g`, a gradient its producer is done with (an op output's, about to
// be released by the tape), to `slot`: shared without a copy when the slot has
// none yet and g has its dtype (GradSlot::take_shared), else added into its
// gradient. Nothing when the slot needs no gradient.
void pass_grad(autograd::GradSlot& slot, const Tensor& g);

// A residual add whose sum also feeds a norm (add_layernorm, add_rms_norm).
struct AddNorm {
  Variable sum;     // x + y: the residual stream
  Variable normed;  // the norm of sum
};

// The backward of such a pair, as one node: the sum's own gradient (sum_slot's, if any) plus
// what norm_backward adds into the slot it is given (the normed output's gradient through the
// norm; not called when that output has none), handed to both addends (pass_grad).
void add_norm_backward(autograd::GradSlot& sum_slot, const autograd::GradSlot& normed_slot,
                       autograd::GradSlot& xs, autograd::GradSlot& ys,
                       const std::function<void(autograd::GradSlot*)>& norm_backward);

// out = x * factor. x: any shape, any float dtype; out: same shape and dtype
// (computed in fp32, then rounded). Saves nothing: backward adds
// dout * factor into x's gradient.
Variable scale(const Variable& x, float factor);

}  // namespace fd::ops
