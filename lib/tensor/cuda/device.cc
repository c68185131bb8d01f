// The CUDA runtime behind device.h (CUDA builds).
#include "lib/tensor/device.h"

#include <fmt/format.h>

#include "kernels/kernels.h"
#include "lib/base/error.h"

namespace fd {

bool cuda_built() { return true; }

int cuda_device_count() { return kernels::device_count(); }

std::string cuda_unavailable_reason() { return kernels::no_device_reason(); }

void init_cuda_device(int index) {
  const int n = kernels::device_count();
  if (n == 0)
    runtime_error("device: cuda requested, but no GPU is usable: {}", kernels::no_device_reason());
  if (index < 0 || index >= n)
    runtime_error("GPU {} requested, but this machine has {} (ordinals 0-{})", index, n, n - 1);
  try {
    kernels::init_device(index);
  } catch (const kernels::Error& e) {
    runtime_error("could not start GPU {}: {}", index, e.what());
  }
}

std::string cuda_blas_library() {
  try {
    return kernels::blas_library();
  } catch (const kernels::Error& e) {
    runtime_error("{}", e.what());
  }
}

std::string cuda_device_name() {
  return fmt::format("cuda:{} ({})", kernels::current_device(), kernels::device_name());
}

}  // namespace fd
