#include "lib/ops/f32_buffer.h"

namespace fd::ops {
namespace {

// Where the fp32 copy of `t` lives: the CPU, or meta for a meta tensor.
Device scratch_device(const Tensor& t) {
  FD_CHECK(!t.is_cuda(), "a {} tensor on {} reached a CPU op", t.shape().str(), t.device().str());
  return t.is_meta() ? Device::meta() : Device::cpu();
}

constexpr const char* kMetaAccess =
    "fp32 data of a meta tensor requested: an op must skip its arithmetic on meta "
    "(lib/ops/backend.h)";

}  // namespace

F32In::F32In(const Tensor& t) : meta_(t.is_meta()) {
  const Device where = scratch_device(t);
  if (t.dtype() == DType::kF32) {
    if (!meta_) p_ = t.data<float>();
    return;
  }
  copy_ = Tensor::empty(t.shape(), DType::kF32, MemCategory::kActivations, where);
  if (meta_) return;
  convert_to_f32(t.dtype(), t.raw(), copy_.data<float>(), size_t(t.numel()));
  p_ = copy_.data<float>();
}

const float* F32In::get() const {
  FD_CHECK(!meta_, "{}", kMetaAccess);
  return p_;
}

F32Out::F32Out(const Tensor& dst, bool load) : dst_(dst), meta_(dst.is_meta()) {
  const Device where = scratch_device(dst);
  if (dst.dtype() == DType::kF32) {
    if (!meta_) p_ = dst.data<float>();
    return;
  }
  copy_ = Tensor::empty(dst.shape(), DType::kF32, MemCategory::kActivations, where);
  if (meta_) return;
  p_ = copy_.data<float>();
  if (load) convert_to_f32(dst.dtype(), dst.raw(), p_, size_t(dst.numel()));
}

float* F32Out::get() const {
  FD_CHECK(!meta_, "{}", kMetaAccess);
  return p_;
}

void F32Out::store() const {
  if (meta_) return;
  if (copy_.defined()) convert_f32_to(dst_.dtype(), p_, dst_.raw(), size_t(dst_.numel()));
}

}  // namespace fd::ops
