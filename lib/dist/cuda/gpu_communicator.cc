// make_gpu_communicator in CUDA builds: NCCL.
#include "lib/dist/gpu_communicator.h"

#include "lib/dist/nccl_communicator.h"

namespace fd::dist {

std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host) {
  return std::make_unique<NcclCommunicator>(host);
}

}  // namespace fd::dist
