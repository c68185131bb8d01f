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
//
// No zero fills: a gradient is created by the first op that writes it
// (grad_update, grad_to_write), and an op whose gradient passes through
// unchanged (a residual add, an identity region) hands the same tensor to
// its inputs (take_shared): the receiving slots mark it borrowed and copy it
// only if something later writes into them (copy on write).
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
  // Defined once a gradient exists (created by its first writer, taken
  // from another slot, or the caller's buffer for bound leaves).
  Tensor grad;
  // `grad` is another slot's gradient too (take_shared): never written in
  // place; ensure_grad, grad_to_write and grad_update make it this slot's own
  // first.
  bool borrowed = false;

  // The gradient buffer, zero-allocated on first use. Non-leaf gradients are
  // activation memory, in the value's dtype, on the value's device.
  const Tensor& ensure_grad();
  // For an op that writes every element of the gradient (a GEMM): when the
  // slot has no gradient yet, a buffer allocated without zeroing and *first
  // true (overwrite it: beta = 0, no fill and no read of zeros); else the
  // gradient there and *first false (accumulate into it).
  const Tensor& grad_to_write(bool* first);
  // For an op that adds a term to every element of the gradient without
  // reading it otherwise: `out` is the gradient to write (this slot's own
  // afterwards) and `prior` what to add the term to: undefined when the slot
  // had no gradient (write 0 + term: no fill, no read), `out` itself when it
  // owns one (+= in place), or the borrowed gradient (out = prior + term: no
  // copy first).
  struct Update {
    Tensor out;
    Tensor prior;
  };
  Update grad_update();
  // Hands `g` (this slot's shape in elements, dtype and device) to a slot with
  // no gradient yet, without a copy: `grad` becomes a view of it, borrowed.
  // False, and nothing done, when the slot has a gradient already or g's dtype
  // or device differ: the caller adds g into ensure_grad() then.
  bool take_shared(const Tensor& g);
  bool has_grad() const { return grad.defined(); }

 private:
  void own_grad();  // a borrowed gradient becomes a private copy
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
