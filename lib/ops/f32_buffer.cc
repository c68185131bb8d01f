#include "lib/ops/f32_buffer.h"

#include <cstring>

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

F32Out F32Out::update(const autograd::GradSlot::Update& u, bool zero_when_new) {
  F32Out o(u.out, false);
  o.fresh_ = !u.prior.defined();
  if (o.meta_) return o;
  const size_t n = size_t(u.out.numel());
  if (o.fresh_) {
    if (zero_when_new) std::memset(o.p_, 0, n * sizeof(float));
  } else if (u.prior.dtype() == DType::kF32) {
    if (u.prior.data<float>() != o.p_) std::memcpy(o.p_, u.prior.data<float>(), n * sizeof(float));
  } else {
    convert_to_f32(u.prior.dtype(), u.prior.raw(), o.p_, n);
  }
  return o;
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
