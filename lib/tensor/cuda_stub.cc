// lib/tensor in a build without the CUDA backend: no GPU exists, and asking
// for one is an fd::Error that says how to get one. (CMake compiles this file
// instead of cuda/*.cc when nvcc is absent or FDTRAIN_CUDA=OFF.)
#include "lib/base/error.h"
#include "lib/tensor/cuda_memory.h"
#include "lib/tensor/device.h"
#include "lib/tensor/host_link.h"

namespace fd {

bool cuda_built() { return false; }

std::string cuda_device_name() { return "none (built without CUDA)"; }

int cuda_device_count() { return 0; }

std::string cuda_unavailable_reason() {
  return "this fdtrain was built without the CUDA backend (FDTRAIN_CUDA=OFF, or nvcc was not "
         "found when it was configured)";
}

std::string cuda_blas_library() {
  runtime_error("no GEMM library to load: {}", cuda_unavailable_reason());
}

CudaAttentionLaunches cuda_attention_launches() { return {}; }

void set_cuda_tf32(bool) {}
void cuda_synchronize() {}

DeviceTimer::DeviceTimer() {
  runtime_error("a GPU timer was requested, but {}", cuda_unavailable_reason());
}
DeviceTimer::~DeviceTimer() = default;
void DeviceTimer::start() {}
void DeviceTimer::stop() {}
double DeviceTimer::seconds() const { return 0.0; }

void init_cuda_device(int) {
  runtime_error("device: cuda requested, but {}; rebuild with nvcc on PATH or use device: cpu",
                cuda_unavailable_reason());
}

namespace cuda_memory {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  usage_error("{} on the GPU, but {}", what, cuda_unavailable_reason());
}
}  // namespace

void check_device(Device device) {
  runtime_error("a tensor on {} was requested, but {}", device.str(), cuda_unavailable_reason());
}
void* allocate(size_t, MemCategory) { no_cuda("an allocation"); }
// Reached only from ~Storage of a GPU allocation, which allocate() never
// made here: nothing to free, and a destructor must not throw.
void deallocate(void*, size_t) {}
void* allocate_pinned(size_t, MemCategory) { no_cuda("page-locked host memory for copies"); }
void free_pinned(void*) {}
std::unique_ptr<HostLink> make_link(int) { no_cuda("a host link"); }
void zero(const Tensor&) { no_cuda("zeroing a tensor"); }
void fill(const Tensor&, float) { no_cuda("filling a tensor"); }
void copy(const Tensor&, const Tensor&) { no_cuda("a copy"); }

}  // namespace cuda_memory
}  // namespace fd
