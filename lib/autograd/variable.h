// Variable: a Tensor value plus the slot its gradient accumulates into.
//
// The value and the gradient slot are held separately: nodes on the tape keep
// the slots of their inputs and outputs (to pass gradients), and only the
// tensors an op explicitly saves for its backward. An activation that no
// backward needs is therefore freed as soon as the forward code drops it.
//
// Gradients always accumulate (+=). A leaf's slot can be bound to a
// caller-provided buffer (a view into a flat gradient buffer); then backward
// adds into that buffer and the caller decides when to zero it.
#pragma once

#include <memory>
#include <string>

#include "lib/tensor/tensor.h"

namespace fd::autograd {

struct GradSlot {
  Shape shape;
  DType dtype = DType::kF32;
  Device device;  // the value's: a gradient lives where its value does
  bool requires_grad = false;
  bool is_leaf = true;
  // Defined once a gradient exists (lazily zero-allocated for non-leaves,
  // or the caller's buffer for bound leaves).
  Tensor grad;

  // The gradient buffer, zero-allocated on first use. Non-leaf gradients are
  // activation memory, in the value's dtype, on the value's device.
  const Tensor& ensure_grad();
  // For an op that writes every element of the gradient (a GEMM): when the
  // slot has no gradient yet, a buffer allocated without zeroing and *first
  // true (overwrite it: beta = 0, no fill and no read of zeros); else the
  // gradient there and *first false (accumulate into it).
  const Tensor& grad_to_write(bool* first);
  bool has_grad() const { return grad.defined(); }
};

class Variable {
 public:
  Variable() = default;
  // A leaf; with requires_grad its gradient is allocated on first use.
  explicit Variable(Tensor value, bool requires_grad = false);
  // A leaf whose gradient accumulates into `grad_buffer` (same shape/dtype numel).
  static Variable bound_leaf(Tensor value, Tensor grad_buffer);

  bool defined() const { return value_.defined(); }
  const Tensor& value() const { return value_; }
  const Shape& shape() const { return value_.shape(); }
  DType dtype() const { return value_.dtype(); }
  bool requires_grad() const { return slot_ && slot_->requires_grad; }
  // The gradient; undefined before backward reached this variable.
  const Tensor& grad() const { return slot_->grad; }
  const std::shared_ptr<GradSlot>& slot() const { return slot_; }

  // For ops: a non-leaf output holding `value`, requiring grad when `requires_grad`.
  static Variable op_output(Tensor value, bool requires_grad);

 private:
  Tensor value_;
  std::shared_ptr<GradSlot> slot_;
};

}  // namespace fd::autograd
