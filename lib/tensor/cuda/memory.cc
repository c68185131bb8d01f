// GPU memory, fills and copies for Storage and Tensor, through kernels/ (CUDA builds).
#include "kernels/kernels.h"
#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/cuda_memory.h"
#include "lib/tensor/tensor.h"

namespace fd::cuda_memory {
namespace {
kernels::DT kdt(DType t) { return static_cast<kernels::DT>(t); }
}  // namespace

void check_device(Device device) {
  FD_CHECK(device.index == kernels::current_device(),
           "storage on {} but this process runs on cuda:{}", device.str(),
           kernels::current_device());
}

void* allocate(size_t bytes, MemCategory category) {
  try {
    return kernels::device_alloc(bytes);
  } catch (const kernels::Error& e) {
    runtime_error(
        "out of GPU memory allocating {} bytes of {} ({}); lower the micro-batch or "
        "sequence length, checkpoint more layers, or raise the ZeRO stage",
        bytes, mem_category_name(category), e.what());
  }
}

void deallocate(void* p, size_t bytes) { kernels::device_free(p, bytes); }

void* allocate_pinned(size_t bytes, MemCategory category) {
  try {
    return kernels::host_alloc(bytes);
  } catch (const kernels::Error& e) {
    runtime_error(
        "cannot pin {} bytes of host memory for {} ({}); the host offload needs page-locked "
        "memory for the gradients and parameters it moves: check `ulimit -l` and free host "
        "memory, or offload to nvme",
        bytes, mem_category_name(category), e.what());
  }
}

void free_pinned(void* p) { kernels::host_free(p); }

void zero(const Tensor& t) { kernels::memset_zero(t.raw(), t.nbytes()); }

void fill(const Tensor& t, float value) {
  // The kernel fills float dtypes; integers and raw bytes (a 4-bit segment) are filled on the host.
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kU8)
    return kernels::fill(t.raw(), kdt(t.dtype()), t.numel(), value);
  Tensor host = Tensor::empty(t.shape(), t.dtype(), MemCategory::kOther, Device::cpu());
  host.fill_(value);
  t.copy_from(host);
}

void copy(const Tensor& dst, const Tensor& src) {
  if (src.dtype() == dst.dtype()) {
    if (dst.is_cuda() && src.is_cuda())
      return kernels::copy_device(dst.raw(), src.raw(), dst.nbytes());
    if (dst.is_cuda()) return kernels::copy_to_device(dst.raw(), src.raw(), dst.nbytes());
    return kernels::copy_to_host(dst.raw(), src.raw(), dst.nbytes());
  }
  FD_CHECK(dst.dtype() != DType::kI32 && src.dtype() != DType::kI32, "no conversion {} -> {}",
           dtype_name(src.dtype()), dtype_name(dst.dtype()));
  if (dst.is_cuda() && src.is_cuda())
    return kernels::cast(src.raw(), kdt(src.dtype()), dst.raw(), kdt(dst.dtype()), dst.numel());
  // Across devices: move the bytes first, convert where the result lives.
  Tensor moved = Tensor::empty(dst.shape(), src.dtype(), MemCategory::kOther, dst.device());
  moved.copy_from(src);
  dst.copy_from(moved);
}

}  // namespace fd::cuda_memory
