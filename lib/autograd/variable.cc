#include "lib/autograd/variable.h"

namespace fd::autograd {

void GradSlot::own_grad() {
  if (!borrowed) return;
  Tensor mine = Tensor::empty(shape, dtype, MemCategory::kActivations, device);
  mine.copy_from(grad);
  grad = mine;
  borrowed = false;
}

const Tensor& GradSlot::ensure_grad() {
  if (!grad.defined()) {
    grad = Tensor::zeros(shape, dtype, MemCategory::kActivations, device);
    borrowed = false;
  }
  own_grad();
  return grad;
}

const Tensor& GradSlot::grad_to_write(bool* first) {
  *first = !grad.defined();
  if (*first) {
    grad = Tensor::empty(shape, dtype, MemCategory::kActivations, device);
    borrowed = false;
  }
  own_grad();
  return grad;
}

GradSlot::Update GradSlot::grad_update() {
  if (!grad.defined()) {
    grad = Tensor::empty(shape, dtype, MemCategory::kActivations, device);
    borrowed = false;
    return {grad, Tensor()};
  }
  if (!borrowed) return {grad, grad};
  Tensor prior = grad;
  grad = Tensor::empty(shape, dtype, MemCategory::kActivations, device);
  borrowed = false;
  return {grad, prior};
}

bool GradSlot::take_shared(const Tensor& g) {
  FD_CHECK(g.numel() == shape.numel(), "a gradient of {} elements for a slot of shape {}",
           g.numel(), shape.str());
  if (grad.defined() || g.dtype() != dtype || !(g.device() == device)) return false;
  grad = g.reshape(shape);
  borrowed = true;
  return true;
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
