#include "lib/autograd/variable.h"

namespace fd::autograd {

const Tensor& GradSlot::ensure_grad() {
  if (!grad.defined()) grad = Tensor::zeros(shape, dtype, MemCategory::kActivations, device);
  return grad;
}

const Tensor& GradSlot::grad_to_write(bool* first) {
  *first = !grad.defined();
  if (*first) grad = Tensor::empty(shape, dtype, MemCategory::kActivations, device);
  return grad;
}

Variable::Variable(Tensor value, bool requires_grad) : value_(std::move(value)) {
  slot_ = std::make_shared<GradSlot>();
  slot_->shape = value_.shape();
  slot_->dtype = value_.dtype();
  if (value_.defined()) slot_->device = value_.device();
  slot_->requires_grad = requires_grad;
  slot_->is_leaf = true;
}

Variable Variable::bound_leaf(Tensor value, Tensor grad_buffer) {
  FD_CHECK(grad_buffer.numel() == value.numel(), "grad buffer of {} for value {}",
           grad_buffer.numel(), value.shape().str());
  Variable v(std::move(value), true);
  v.slot_->grad = grad_buffer.reshape(v.value_.shape());
  return v;
}

Variable Variable::op_output(Tensor value, bool requires_grad) {
  Variable v(std::move(value), requires_grad);
  v.slot_->is_leaf = false;
  return v;
}

}  // namespace fd::autograd
