// make_gpu_communicator in CUDA builds: NCCL, or at world 1 a local
// communicator whose copies are device copies on the compute stream (no NCCL
// set-up, no communication stream, nothing to wait for).
#include "lib/dist/gpu_communicator.h"

#include "kernels/kernels.h"
#include "lib/dist/local_communicator.h"
#include "lib/dist/nccl_communicator.h"

namespace fd::dist {

std::unique_ptr<Communicator> make_gpu_communicator(Communicator& host) {
  if (host.size() == 1) return std::make_unique<LocalCommunicator>(&kernels::copy_device);
  return std::make_unique<NcclCommunicator>(host);
}

}  // namespace fd::dist
