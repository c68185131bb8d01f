#include "lib/tensor/tensor.h"

#include <cstring>

#include "lib/tensor/cuda_memory.h"

namespace fd {

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category) {
  return empty(shape, dtype, category, default_device());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category, Device device) {
  auto storage =
      std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), category, device);
  return view_of(std::move(storage), 0, shape, dtype);
}

Tensor Tensor::released(const Shape& shape, DType dtype, MemCategory category, Device device) {
  auto storage = std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), category,
                                           device, Storage::Released{});
  return view_of(std::move(storage), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category) {
  return zeros(shape, dtype, category, default_device());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category, Device device) {
  Tensor t = empty(shape, dtype, category, device);
  t.zero_();
  return t;
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape,
                       DType dtype) {
  FD_CHECK((offset + size_t(shape.numel())) * dtype_size(dtype) <= storage->bytes(),
           "view {} at offset {} exceeds storage of {} bytes", shape.str(), offset,
           storage->bytes());
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                           MemCategory category) {
  FD_CHECK(int64_t(values.size()) == shape.numel(), "{} values for shape {}", values.size(),
           shape.str());
  const Device device = default_device();
  if (device.is_meta()) return empty(shape, dtype, category, device);
  Tensor t = empty(shape, dtype, category, Device::cpu());
  if (dtype == DType::kI32) {
    for (size_t i = 0; i < values.size(); ++i) t.data<int32_t>()[i] = int32_t(values[i]);
  } else {
    convert_f32_to(dtype, values.data(), t.raw(), values.size());
  }
  return device.is_cpu() ? t : t.to_device(device, category);
}

Tensor Tensor::reshape(const Shape& shape) const {
  FD_CHECK(shape.numel() == numel(), "reshape {} -> {}", shape_.str(), shape.str());
  return view_of(storage_, offset_, shape, dtype_);
}

Tensor Tensor::flat_slice(int64_t begin, int64_t count) const {
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= numel(), "slice [{}, {}) of {}", begin,
           begin + count, numel());
  return view_of(storage_, offset_ + size_t(begin), Shape{count}, dtype_);
}

void Tensor::zero_() const {
  if (is_meta()) return;
  if (is_cuda()) return cuda_memory::zero(*this);
  if (nbytes() != 0) std::memset(raw(), 0, nbytes());  // an empty tensor may have no memory (UB)
}

void Tensor::fill_(float value) const {
  if (is_meta()) return;
  if (is_cuda()) return cuda_memory::fill(*this, value);
  size_t n = size_t(numel());
  switch (dtype_) {
    case DType::kF32: {
      float* p = data<float>();
      for (size_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t h = dtype_ == DType::kBF16 ? f32_to_bf16(value) : f32_to_f16(value);
      auto* p = data<uint16_t>();
      for (size_t i = 0; i < n; ++i) p[i] = h;
      return;
    }
    case DType::kI32: {
      auto* p = data<int32_t>();
      for (size_t i = 0; i < n; ++i) p[i] = int32_t(value);
      return;
    }
    case DType::kU8: {
      auto* p = data<uint8_t>();
      for (size_t i = 0; i < n; ++i) p[i] = uint8_t(value);
      return;
    }
  }
}

void Tensor::copy_from(const Tensor& src) const {
  FD_CHECK(src.numel() == numel(), "copy of {} elements into {}", src.numel(), numel());
  if (is_meta() || src.is_meta()) {
    FD_CHECK(is_meta() && !src.is_cuda(),
             "copy from {} into {}: a meta tensor has no values to copy out, and takes values "
             "only from the CPU or meta",
             src.device().str(), device().str());
    FD_CHECK(src.dtype_ == dtype_ || (dtype_ != DType::kI32 && src.dtype_ != DType::kI32),
             "no conversion {} -> {}", dtype_name(src.dtype_), dtype_name(dtype_));
    return;
  }
  if (is_cuda() || src.is_cuda()) return cuda_memory::copy(*this, src);
  if (numel() == 0) return;  // empty tensors may have no memory: nothing to pass to memmove
  if (src.dtype_ == dtype_) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  FD_CHECK(dtype_ != DType::kI32 && src.dtype_ != DType::kI32, "no conversion {} -> {}",
           dtype_name(src.dtype_), dtype_name(dtype_));
  if (src.dtype_ == DType::kF32) {
    convert_f32_to(dtype_, src.data<float>(), raw(), size_t(numel()));
  } else if (dtype_ == DType::kF32) {
    convert_to_f32(src.dtype_, src.raw(), data<float>(), size_t(numel()));
  } else {
    std::vector<float> tmp(static_cast<size_t>(numel()));
    convert_to_f32(src.dtype_, src.raw(), tmp.data(), tmp.size());
    convert_f32_to(dtype_, tmp.data(), raw(), tmp.size());
  }
}

Tensor Tensor::to(DType dtype, MemCategory category) const {
  Tensor t = empty(shape_, dtype, category, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to_device(Device d, MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category, d);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  if (is_meta()) return std::vector<float>(static_cast<size_t>(numel()), 0.0f);
  if (is_cuda()) return to_device(Device::cpu(), MemCategory::kOther).to_vector();
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype_ == DType::kI32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(data<int32_t>()[i]);
  } else {
    convert_to_f32(dtype_, raw(), out.data(), out.size());
  }
  return out;
}

}  // namespace fd
