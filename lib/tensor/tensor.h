// Tensor: a typed, shaped, contiguous view into a Storage.
//
// Tensors are cheap handles (shared ownership of the storage); copying a
// Tensor copies the handle, not the data. All tensors are row-major and
// contiguous; a view is an element offset plus a shape into a larger
// storage, which is how parameters live inside a segment's flat buffer.
#pragma once

#include <memory>
#include <vector>

#include "lib/base/check.h"
#include "lib/tensor/dtype.h"
#include "lib/tensor/shape.h"
#include "lib/tensor/storage.h"

namespace fd {

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  // New storage of shape.numel() elements on `device` (the thread's
  // default_device() when not given); contents unspecified.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32,
                      MemCategory category = MemCategory::kActivations);
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category, Device device);
  // New storage filled with zeros (default device).
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32,
                      MemCategory category = MemCategory::kActivations);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category, Device device);
  // A view of `shape` at element offset `offset` (in units of dtype) into `storage`.
  static Tensor view_of(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape,
                        DType dtype);
  // Tensor on the default device holding a copy of `values` (size must match shape).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::kF32,
                            MemCategory category = MemCategory::kActivations);

  bool defined() const { return storage_ != nullptr; }
  bool is_cuda() const { return storage_ != nullptr && storage_->device().is_cuda(); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  size_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // The first element's address: host memory for CPU tensors, a device
  // pointer for CUDA tensors (pass it to kernels/ or a communicator, never
  // dereference it on the host).
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_); }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  // Typed accessors that check the dtype.
  float* f32() const {
    FD_CHECK(dtype_ == DType::kF32, "expected f32 tensor, got {}", dtype_name(dtype_));
    return data<float>();
  }
  int32_t* i32() const {
    FD_CHECK(dtype_ == DType::kI32, "expected i32 tensor, got {}", dtype_name(dtype_));
    return data<int32_t>();
  }

  // The same elements with another shape of equal numel.
  Tensor reshape(const Shape& shape) const;
  // Elements [begin, begin + count) of the flattened tensor, as a 1-D view.
  Tensor flat_slice(int64_t begin, int64_t count) const;

  void zero_() const;
  void fill_(float value) const;
  // Copies src's elements (same numel) converting dtype as needed, between
  // any two devices.
  void copy_from(const Tensor& src) const;
  // A new tensor with the same elements in `dtype` (on this tensor's device).
  Tensor to(DType dtype, MemCategory category = MemCategory::kActivations) const;
  // A new tensor with the same elements and dtype on `device`.
  Tensor to_device(Device device, MemCategory category = MemCategory::kActivations) const;
  // The elements as fp32 values (copied to the host; synchronises with the GPU).
  std::vector<float> to_vector() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace fd
