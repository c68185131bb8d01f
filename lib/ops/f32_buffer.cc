#include "lib/ops/f32_buffer.h"

namespace fd::ops {

F32In::F32In(const Tensor& t) {
  FD_CHECK(!t.is_cuda(), "a {} tensor on {} reached a CPU op", t.shape().str(), t.device().str());
  if (t.dtype() == DType::kF32) {
    p_ = t.data<float>();
    return;
  }
  copy_ = Tensor::empty(t.shape(), DType::kF32, MemCategory::kActivations, Device::cpu());
  convert_to_f32(t.dtype(), t.raw(), copy_.data<float>(), size_t(t.numel()));
  p_ = copy_.data<float>();
}

F32Out::F32Out(const Tensor& dst, bool load) : dst_(dst) {
  FD_CHECK(!dst.is_cuda(), "a {} tensor on {} reached a CPU op", dst.shape().str(),
           dst.device().str());
  if (dst.dtype() == DType::kF32) {
    p_ = dst.data<float>();
    return;
  }
  copy_ = Tensor::empty(dst.shape(), DType::kF32, MemCategory::kActivations, Device::cpu());
  p_ = copy_.data<float>();
  if (load) convert_to_f32(dst.dtype(), dst.raw(), p_, size_t(dst.numel()));
}

void F32Out::store() const {
  if (copy_.defined()) convert_f32_to(dst_.dtype(), p_, dst_.raw(), size_t(dst_.numel()));
}

}  // namespace fd::ops
