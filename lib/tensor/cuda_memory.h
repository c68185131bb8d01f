// The GPU side of Storage and Tensor. Internal to lib/tensor.
//
// Defined in cuda/memory.cc (CUDA builds, through kernels/) and in
// cuda_stub.cc otherwise; CMake picks one (fd_library in CMakeLists.txt). In a
// build without CUDA no GPU tensor can exist (check_device throws), so the
// stub's other functions are never reached; they throw all the same.
#pragma once

#include <cstddef>

#include "lib/tensor/device.h"
#include "lib/tensor/memory.h"

#include <memory>

namespace fd {
class Tensor;
class HostLink;
}

namespace fd::cuda_memory {

// Checks that a Storage may live on `device` (a GPU): the process's own GPU
// (FD_CHECK) in CUDA builds; an fd::Error saying CUDA is missing otherwise.
void check_device(Device device);
// `bytes` of device memory from kernels/' caching allocator; running out is an
// fd::Error naming the category and what to lower.
void* allocate(size_t bytes, MemCategory category);
void deallocate(void* p, size_t bytes);
// `bytes` of page-locked host memory (Storage::Pinned); failing to lock it is
// an fd::Error naming the category.
void* allocate_pinned(size_t bytes, MemCategory category);
void free_pinned(void* p);
// The GPU's HostLink (lib/tensor/host_link.h): a transfer stream, an event per slot.
std::unique_ptr<HostLink> make_link(int slots);

// Tensor::zero_, fill_ and copy_from where a GPU tensor is involved (copy:
// either side on the GPU, the other on the CPU or the GPU).
void zero(const Tensor& t);
void fill(const Tensor& t, float value);
void copy(const Tensor& dst, const Tensor& src);

}  // namespace fd::cuda_memory
