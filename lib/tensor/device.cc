#include "lib/tensor/device.h"

#include <fmt/format.h>

#include "lib/base/error.h"

#if FDTRAIN_HAVE_CUDA
#include "kernels/kernels.h"
#endif

namespace fd {
namespace {
thread_local Device t_default_device;
}  // namespace

std::string Device::str() const {
  return type == DeviceType::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

#if FDTRAIN_HAVE_CUDA
bool cuda_built() { return true; }
int cuda_device_count() { return kernels::device_count(); }
std::string cuda_unavailable_reason() { return kernels::no_device_reason(); }
void init_cuda_device(int index) {
  const int n = kernels::device_count();
  if (n == 0) runtime_error("device: cuda requested, but no GPU is usable: {}", kernels::no_device_reason());
  if (index < 0 || index >= n)
    runtime_error("GPU {} requested, but this machine has {} (ordinals 0-{})", index, n, n - 1);
  try {
    kernels::init_device(index);
  } catch (const kernels::Error& e) {
    runtime_error("could not start GPU {}: {}", index, e.what());
  }
}
std::string cuda_device_name() {
  return fmt::format("cuda:{} ({})", kernels::current_device(), kernels::device_name());
}
#else
bool cuda_built() { return false; }
std::string cuda_device_name() { return "none (built without CUDA)"; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() {
  return "this fdtrain was built without the CUDA backend (FDTRAIN_CUDA=OFF, or nvcc was not "
         "found when it was configured)";
}
void init_cuda_device(int) {
  runtime_error("device: cuda requested, but {}; rebuild with nvcc on PATH or use device: cpu",
                cuda_unavailable_reason());
}
#endif

Device default_device() { return t_default_device; }

DeviceScope::DeviceScope(Device d) : previous_(t_default_device) { t_default_device = d; }
DeviceScope::~DeviceScope() { t_default_device = previous_; }

}  // namespace fd
