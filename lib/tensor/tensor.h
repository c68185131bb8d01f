// Tensor: a typed, shaped, contiguous view into a Storage.
//
// Tensors are cheap handles (shared ownership of the storage); copying a
// Tensor copies the handle, not the data. All tensors are row-major and
// contiguous; a view is an element offset plus a shape into a larger
// storage, which is how parameters live inside a segment's flat buffer.
//
// Meta tensors (device.h) have no values. Reading or writing their elements
// (raw(), data(), f32(), i32()) is an FD_CHECK failure, so nothing can compute
// on them by accident. What the engine does with tensors whatever their
// device still works, and costs nothing:
//   - zero_() and fill_() do nothing;
//   - copy_from() into a meta tensor, from a meta or CPU tensor, does nothing
//     (to() and to_device(meta) allocate the result as usual); a copy out of
//     a meta tensor into a CPU or GPU tensor is an FD_CHECK failure;
//   - to_vector() returns zeros: the engine reads scalars (a loss, a norm) to
//     steer its control flow, which then runs as if every value were 0;
//   - from_vector() on the meta default device returns a meta tensor (the
//     values are dropped);
//   - comm_data() is nullptr, which only communicators that move nothing
//     accept (LocalCommunicator, the counting communicator).
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
  // A tensor whose new storage starts released (Storage::Released): it may
  // not be read or written before storage()->acquire().
  static Tensor released(const Shape& shape, DType dtype, MemCategory category,
                         Device device = default_device());
  // A view of `shape` at element offset `offset` (in units of dtype) into `storage`.
  static Tensor view_of(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape,
                        DType dtype);
  // Tensor on the default device holding a copy of `values` (size must match
  // shape; on meta the values are dropped).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::kF32,
                            MemCategory category = MemCategory::kActivations);

  bool defined() const { return storage_ != nullptr; }
  bool is_cuda() const { return storage_ != nullptr && storage_->device().is_cuda(); }
  bool is_meta() const { return storage_ != nullptr && storage_->device().is_meta(); }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  size_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // The first element's address: host memory for CPU tensors, a device
  // pointer for CUDA tensors (pass it to kernels/ or a communicator, never
  // dereference it on the host). Not for meta tensors (FD_CHECK).
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_); }
  // The buffer to hand a communicator: raw(), or nullptr for a meta tensor.
  void* comm_data() const { return is_meta() ? nullptr : raw(); }
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
  // The elements as fp32 values (copied to the host; synchronises with the
  // GPU). Zeros for a meta tensor.
  std::vector<float> to_vector() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

}  // namespace fd
