// lib/dist in a build without CUDA (CMake compiles this file instead of
// cuda/*.cc): there is no GPU communicator to make.
#include "lib/base/error.h"
#include "lib/dist/gpu_communicator.h"
#include "lib/tensor/device.h"

namespace fd::dist {

std::unique_ptr<Communicator> make_gpu_communicator(Communicator&) {
  usage_error("a GPU communicator was requested, but {}", cuda_unavailable_reason());
}

}  // namespace fd::dist
